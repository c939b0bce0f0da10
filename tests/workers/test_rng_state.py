"""A role's RNG streams survive its checkpoint: saved as tensors and plain values (a
weights-only load reads them), put back they draw what they would have drawn."""
from __future__ import annotations

import random

import numpy as np
import torch

from asr_grpo.workers.rng import rng_state, seed_rngs, set_rng_state


def draws() -> tuple:
    return (torch.rand(3).tolist(), np.random.rand(3).tolist(), np.random.standard_normal(3).tolist(),
            [random.random() for _ in range(3)], [random.gauss(0, 1) for _ in range(3)])


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    seed_rngs(7)
    draws()                                   # move every stream off its seed
    np.random.standard_normal()               # numpy (and Python) keep a cached gaussian: saved too
    random.gauss(0, 1)
    torch.save({"rng": rng_state()}, tmp_path / "state.pt")
    expected = draws()
    seed_rngs(123)                            # elsewhere
    set_rng_state(torch.load(tmp_path / "state.pt", weights_only=True)["rng"])
    assert draws() == expected


def test_seeding_is_reproducible_and_no_state_is_a_no_op():
    seed_rngs(3)
    first = draws()
    seed_rngs(3)
    set_rng_state(None)
    assert draws() == first
