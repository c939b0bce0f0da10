"""A Qwen3-ASR checkpoint of fresh weights, written without a model hub: the model
group's architecture around a tokenizer trained on the corpus or the user's text (or a
given Qwen3-ASR tokenizer), with the processor beside it, so `from_pretrained` loads it
and SFT (sft=default) starts from it. `python -m asr_grpo.init_checkpoint` writes one;
`model.init=random` writes one per architecture for RL systems runs."""
from __future__ import annotations

from pathlib import Path

from asr_grpo.config.errors import ConfigError
from asr_grpo.data import AsrDataset, resolve_manifests
from asr_grpo.data.manifest import read_manifest
from asr_grpo.models import build_model, build_processor, fresh_model, save_hf_checkpoint
from asr_grpo.models.tokenizer import qwen3_asr_tokenizer_problem


def corpus_texts(data_cfg, output_root) -> tuple[list[str], list[str]]:
    """(transcripts, languages) of the corpus' training split (the demo corpus is built if needed)."""
    utts = AsrDataset(resolve_manifests(data_cfg, output_root).train, data_cfg, split="train").utterances
    return [u.text for u in utts], [u.language for u in utts]


def file_texts(files: list[str], languages: list[str], default_language: str = "") -> tuple[list[str], list[str]]:
    """(texts, languages) of text files (one utterance a line; `languages` their languages)
    and JSONL manifests (each line's text and language)."""
    texts, langs = [], list(languages)
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"text: {name} does not exist")
        if path.suffix == ".jsonl":
            utts = read_manifest(path, default_language=default_language).utterances
            texts += [u.text for u in utts]
            langs += [u.language for u in utts]
        else:
            texts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise ConfigError(f"text: {', '.join(files)} hold no text to train a tokenizer on")
    return texts, langs


def given_tokenizer(folder: str):
    """A Qwen3-ASR tokenizer from `folder`, as it is; a ConfigError naming what it lacks."""
    from transformers import AutoTokenizer

    if not Path(folder).is_dir():
        raise ConfigError(f"tokenizer={folder}: no such folder")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if (problem := qwen3_asr_tokenizer_problem(tokenizer)) is not None:
        raise ConfigError(f"tokenizer={folder}: {problem} (a Qwen3-ASR checkpoint's tokenizer has them; "
                          f"leave tokenizer empty to train one on your text)")
    return tokenizer


def write_fresh_checkpoint(model_cfg, out: str | Path, seed: int, texts: list[str] | None = None,
                           languages: list[str] | None = None, tokenizer=None,
                           metadata: dict | None = None) -> Path:
    """Fresh weights of `model_cfg` around `tokenizer`, or one trained on `texts`, saved
    atomically at `out` and marked `init: random` (SFT then picks its from-scratch recipe)."""
    if tokenizer is None:
        model, processor = fresh_model(model_cfg, texts, seed=seed, languages=languages or ["en", "zh"])
    else:
        model, processor = build_model(model_cfg, tokenizer, seed=seed), build_processor(tokenizer)
    return save_hf_checkpoint(model, processor, out, {"init": "random", **(metadata or {})})
