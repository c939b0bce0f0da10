"""Qwen3-ASR prompts: transcription requests for generation and labelled batches for SFT.

The language is forced the way Qwen3-ASR does it: the assistant turn is prefilled
with `language <Name><asr_text>`, so the model only generates the transcript + EOS.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers import BatchFeature

from asr_grpo.data.languages import canonical_code, language
from asr_grpo.models.tokenizer import ASR_TEXT, IM_END

IGNORE_INDEX = -100
# The chat template renders an audio item as one placeholder token; its samples are unused.
_PLACEHOLDER_AUDIO = np.zeros(1600, dtype=np.float32)


def transcription_prompts(processor, num: int, languages: Sequence[str] | None,
                          context: Sequence[str | None] | None = None) -> list[str]:
    """Prompt strings (audio placeholder not yet expanded), one per utterance.

    The conversation `Qwen3ASRProcessor.apply_transcription_request` builds (context in a
    system turn, the audio in the user turn, the assistant turn prefilled with `language
    <Name><asr_text>` to force the language), rendered by the processor's chat template.
    Built here rather than through that method, which renders strings only from
    transformers 5.24 on (`tokenize=False`; 5.19 always tokenizes).
    """
    conversations = []
    for i in range(num):
        messages = []
        if context is not None and context[i] is not None:
            messages.append({"role": "system", "content": [{"type": "text", "text": context[i]}]})
        messages.append({"role": "user", "content": [{"type": "audio", "audio": _PLACEHOLDER_AUDIO}]})
        prefill = (f"language {language(canonical_code(languages[i])).name}<asr_text>"
                   if languages is not None else "")
        messages.append({"role": "assistant", "content": [{"type": "text", "text": prefill}]})
        conversations.append(messages)
    return processor.apply_chat_template(conversations, tokenize=False, continue_final_message=True)


def encode_requests(processor, audios: Sequence[np.ndarray], languages: Sequence[str] | None,
                    context: Sequence[str | None] | None = None) -> BatchFeature:
    """Left-padded generation inputs: input_ids, attention_mask, input_features(+mask)."""
    prompts = transcription_prompts(processor, len(audios), languages, context)
    return processor(text=prompts, audio=list(audios), padding_side="left")


def encode_supervised(processor, audios: Sequence[np.ndarray], languages: Sequence[str],
                      transcripts: Sequence[str],
                      context: Sequence[str | None] | None = None) -> BatchFeature:
    """Prompt + transcript + EOS, with labels only on the transcript and EOS.

    `processor(..., output_labels=True)` masks only audio and padding, so the prompt
    up to and including `<asr_text>` is masked here.
    """
    prompts = transcription_prompts(processor, len(audios), languages, context)
    texts = [p + t + IM_END for p, t in zip(prompts, transcripts)]
    batch = processor(text=texts, audio=list(audios), padding_side="right", output_labels=True)
    asr_text_id = processor.tokenizer.convert_tokens_to_ids(ASR_TEXT)
    labels = batch["labels"]
    is_tag = batch["input_ids"] == asr_text_id
    if not bool(is_tag.any(dim=1).all()):
        raise ValueError("a supervised sample has no <asr_text> tag in its prompt")
    # Everything up to the (first) tag, inclusive, is prompt.
    tag_pos = is_tag.int().argmax(dim=1, keepdim=True)
    positions = torch.arange(labels.shape[1]).unsqueeze(0)
    labels[positions <= tag_pos] = IGNORE_INDEX
    batch["labels"] = labels
    return batch


def decode_responses(processor, token_ids: torch.Tensor | Sequence[Sequence[int]]) -> list[str]:
    """Generated token ids (response only) -> transcript text, special tokens dropped."""
    return processor.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
