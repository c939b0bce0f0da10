"""The update loop shared by the policy and the critic: epochs x micro-batches through a
DeepSpeed engine, metrics averaged over micro-batches. A NaN or inf never reaches the
optimizer: the experience is checked before the first micro-batch, each loss before
its backward pass."""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import numpy as np
import torch

from asr_grpo.config.schema import TrainerConfig
from asr_grpo.experience.types import NonFiniteError, check_finite


def micro_batches(items: Sequence, size: int, rng: np.random.Generator, by_group: bool = False) -> list[list]:
    """Items in shuffled micro-batches of `size`. `by_group`: the groups are shuffled and
    each keeps its items together, so a micro-batch holds few prompts and the training
    forward runs each of them once for all its samples (`sequences._shared_prompt_logits`)."""
    if not by_group:
        order = rng.permutation(len(items))
    else:
        members: dict = {}
        for i, it in enumerate(items):
            members.setdefault(it.group, []).append(i)
        groups = list(members.values())
        order = [i for g in rng.permutation(len(groups)) for i in groups[g]]
    return [[items[i] for i in order[s:s + size]] for s in range(0, len(items), size)]


def run_updates(engine, items: Sequence, trainer: TrainerConfig,
                loss_fn: Callable[[object, list], tuple[torch.Tensor, dict]], seed: int = 0) -> dict[str, float]:
    check_finite(items, "training batch")
    engine.train()
    sums: dict[str, float] = defaultdict(float)
    count = 0
    rng = np.random.default_rng(seed + engine.global_steps)
    grad_norms = []
    for _ in range(trainer.train_epochs):
        for mb in micro_batches(items, trainer.micro_batch_size, rng, trainer.micro_batch_by_group):
            loss, metrics = loss_fn(engine, mb)
            if not bool(torch.isfinite(loss)):
                raise NonFiniteError(f"non-finite loss {float(loss)} on samples {[it.uid for it in mb]}: "
                                     f"refused before backward (optimizer steps so far: {engine.global_steps})")
            engine.backward(loss)
            if engine.step() and engine.global_grad_norm is not None:
                grad_norms.append(engine.global_grad_norm)
            for k, v in metrics.items():
                sums[k] += float(v)
            count += 1
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out["charts/lr"] = engine.lr
    if grad_norms:
        out["charts/grad_norm"] = float(np.mean(grad_norms))
    return out
