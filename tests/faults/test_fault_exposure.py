"""Exposure: checkpoints are read without unpickling code. A checkpoint file carrying a
pickled payload (here: create a file) fails to load instead of running it, through the
DeepSpeed loader resume uses and through the HF folder loader. (Ports: every socket a
live run opens is on the loopback, in test_fault_workers; docs/rewards.md says a reward
file is code that runs with the user's rights.)"""
from __future__ import annotations

import pickle

import pytest
import torch
from fault_injection import armed_checkpoint

from asr_grpo.distributed.deepspeed_strategy import load_weights_only
from asr_grpo.models import load_model, save_hf_checkpoint


def test_the_payload_is_armed(tmp_path):
    marker = tmp_path / "ran"
    torch.load(armed_checkpoint(tmp_path / "x.pt", marker), weights_only=False)   # what a plain load does
    assert marker.exists()


def test_deepspeed_state_is_read_weights_only(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
        load_weights_only(str(armed_checkpoint(tmp_path / "optim_states.pt", marker)))
    assert not marker.exists()


def test_hf_folder_with_a_pickled_model_is_refused(tmp_path, tiny_model, tiny_processor):
    folder = save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "hf")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    armed_checkpoint(folder / "pytorch_model.bin", marker)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_model(str(folder))
    assert not marker.exists()
