"""Where a role computes: its device, and the data-parallel process group of its ranks."""
from __future__ import annotations

import os

import torch


def role_device() -> torch.device:
    """Where this role's model runs: its GPU when Ray gave it one (Ray sets
    CUDA_VISIBLE_DEVICES to the actor's own devices, so that GPU is index 0), else CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def join_process_group() -> int:
    """Join the role's data-parallel group from the env vars its RoleGroup set; returns the rank."""
    from asr_grpo.distributed.deepspeed_strategy import init_distributed

    rank = int(os.environ["RANK"])
    init_distributed(rank, int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                     int(os.environ["MASTER_PORT"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    return rank
