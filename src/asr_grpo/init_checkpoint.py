"""`python -m asr_grpo.init_checkpoint model=qwen3_asr_0p6b` (or `asr-grpo-init`): a
Qwen3-ASR checkpoint at a named size with fresh weights, a tokenizer and the processor,
without a model hub. `text=[a.txt,b.jsonl]` trains the tokenizer on your text instead of
the demo corpus; `tokenizer=<folder>` uses a Qwen3-ASR tokenizer as it is."""
from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.errors import one_line_errors
from asr_grpo.config.store import CONF_DIR

log = logging.getLogger(__name__)
register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="init")
def main(cfg: DictConfig) -> None:
    with one_line_errors("asr_grpo.init_checkpoint"):   # a missing text file or tokenizer: say what
        from asr_grpo.models import parameter_counts
        from asr_grpo.models.builder import load_model
        from asr_grpo.recipes.fresh_checkpoint import (
            corpus_texts,
            file_texts,
            given_tokenizer,
            write_fresh_checkpoint,
        )

        tokenizer = given_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        texts = languages = None
        if tokenizer is None:
            texts, languages = (file_texts(list(cfg.text), list(cfg.languages), cfg.data.default_language)
                                if cfg.text else corpus_texts(cfg.data, cfg.paths.output_root))
        path = write_fresh_checkpoint(cfg.model, cfg.output_dir, cfg.seed, texts, languages, tokenizer)
    counts = parameter_counts(load_model(str(path))[0])
    print(f"{path}: Qwen3-ASR, {counts.total / 1e6:.1f}M parameters ({counts.audio_encoder / 1e6:.1f}M audio "
          f"encoder), fresh weights; SFT it with `python -m asr_grpo.sft model.path={path}`")


if __name__ == "__main__":
    main()
