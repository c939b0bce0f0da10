"""Writes checkpoints in a loop until it is killed (the interrupted-checkpoint test).

    python ckpt_writer.py <out> rl   # RL layout: staging folder -> commit -> `latest`
    python ckpt_writer.py <out> hf   # one HF folder saved over and over (the SFT save)

Save k holds the default tiny Qwen3-ASR (~5M parameters, so a save takes long enough
to be killed in the middle of) with its first embedding row filled with k; an RL save
also holds a 48 MB stand-in for the optimizer state.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

OPTIMIZER_FLOATS = 12 * 1024 * 1024


def marked(model, step: int):
    with torch.no_grad():
        model.get_input_embeddings().weight[0].fill_(float(step))
    return model


def main(out: Path, mode: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: helpers
    from helpers import TINY_TEXTS

    from asr_grpo.config.schema import ModelConfig
    from asr_grpo.models import build_model, build_processor, save_hf_checkpoint, train_tokenizer
    from asr_grpo.models import step_checkpoints as ckpt

    tokenizer = train_tokenizer(TINY_TEXTS, vocab_size=400)
    processor, model = build_processor(tokenizer), build_model(ModelConfig(), tokenizer, seed=0)
    optimizer = {"state": torch.randn(OPTIMIZER_FLOATS)}
    out.mkdir(parents=True, exist_ok=True)
    step = 0
    while True:
        step += 1
        if mode == "rl":
            staging = ckpt.staging_dir(out, step)
            save_hf_checkpoint(marked(model, step), processor, staging / "hf", {"step": step})
            save_file(optimizer, str(staging / "optimizer.safetensors"))
            ckpt.commit(out, staging, step, {"step": step})
        else:
            save_hf_checkpoint(marked(model, step), processor, out / "sft", {"step": step})


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
