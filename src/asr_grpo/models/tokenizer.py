"""A small tokenizer trained locally on the corpus text, in the Qwen3-ASR prompt format.

Byte-level BPE (so any text in any script encodes, nothing is <unk>), but every
character of a script written without spaces (Chinese characters, Japanese kana, Thai)
is split off on its own before BPE: merges can join the bytes of one character into a
token, never several characters into a phrase. A first trial without that split
merged whole Chinese phrases into single tokens and the model could not learn them.
Spaced scripts (Latin, Cyrillic, Greek, Arabic, Hangul, ...) merge within words as
usual.
"""
from __future__ import annotations

from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from asr_grpo.data.languages import language

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
AUDIO_PAD = "<|audio_pad|>"
ASR_TEXT = "<asr_text>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, AUDIO_START, AUDIO_END, AUDIO_PAD, ASR_TEXT]

# Qwen3-ASR's prompt layout: role blocks; an audio item is one placeholder that the
# processor expands to the number of audio frames.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'audio' -%}<|audio_start|><|audio_pad|><|audio_end|>"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>{{ 'assistant\\n' }}{%- endif -%}"
)

# CJK Unified Ideographs (+ extension A), CJK punctuation/full-width forms, Hiragana,
# Katakana (+ phonetic extensions) and Thai: scripts without spaces between words.
_CJK_CHAR = r"[\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef\u3040-\u30ff\u31f0-\u31ff\u0e00-\u0e7f]"


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_CJK_CHAR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def train_tokenizer(texts: Iterable[str], vocab_size: int,
                    languages: Iterable[str] = ("en", "zh")) -> PreTrainedTokenizerFast:
    """Train the BPE on `texts` (corpus transcripts plus the prompt vocabulary: the
    `language <Name>` prefix of each code in `languages`)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The fixed prompt words ("language English", roles) are added so they tokenize compactly.
    names = [language(code).name for code in dict.fromkeys(languages)]
    prompt_words = [f"language {name}" for name in names] + ["language None", "system", "user", "assistant"]
    tok.train_from_iterator(list(texts) + prompt_words * 50, trainer=trainer)
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers` object with the attributes Qwen3ASRProcessor reads."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START, ASR_TEXT],
        extra_special_tokens={
            "audio_token": AUDIO_PAD,
            "audio_bos_token": AUDIO_START,
            "audio_eos_token": AUDIO_END,
        },
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    return fast


def qwen3_asr_tokenizer_problem(tokenizer) -> str | None:
    """What a given tokenizer lacks for the Qwen3-ASR processor and prompt (None: nothing):
    the audio placeholder tokens as its attributes, the role and pad tokens, a chat template."""
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    attrs = [a for a in ("audio_token", "audio_bos_token", "audio_eos_token") if not getattr(tokenizer, a, None)]
    lacks = ([f"tokens {', '.join(missing)}"] if missing else []) + (
        [f"attributes {', '.join(attrs)}"] if attrs else []) + ([] if tokenizer.chat_template else ["a chat template"])
    return f"lacks {'; '.join(lacks)}" if lacks else None
