"""Small helpers shared by tests (importable: `tests/` is on pytest's pythonpath)."""
from __future__ import annotations

import numpy as np

from asr_grpo.config.schema import ModelConfig

TINY_TEXTS = ["turn on the lights in the kitchen", "call alice at five thirty", "send the report to bob",
              "请打开客厅的灯", "明天上午九点去北京", "给张伟打电话"] * 10
TINY_MODEL = ModelConfig(encoder_layers=1, encoder_d_model=64, encoder_heads=2, encoder_ffn_dim=128,
                         encoder_downsample_hidden=16, text_layers=2, text_hidden=64, text_heads=2,
                         text_kv_heads=1, text_intermediate=128)


def noise_audio(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)
