"""An exponential moving average of a trained model's weights (OpenRLHF's `--enable_ema`).

RL moves the policy by small noisy steps, so the weights of any one step sit somewhere
in a cloud around where the run is heading; their average along the run evaluates
better than the last iterate does (Polyak averaging). The average only watches: the
policy keeps rolling out and training with its own weights, and the averaged weights
are swapped in for evaluation and written beside each checkpoint.

Each rank averages the part of every trainable parameter it holds: the whole tensor
under ZeRO 0-2, its own partition (`ds_tensor`) under ZeRO-3, so swapping the average
in and then gathering the parameters gives every rank the full averaged model.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def local_part(param: torch.nn.Parameter) -> torch.Tensor:
    """The values of `param` this rank holds: its ZeRO-3 partition, else the tensor itself."""
    return param.ds_tensor if hasattr(param, "ds_tensor") else param.data


def warmed_decay(decay: float, updates: int) -> float:
    """The decay of the `updates`-th update (0-based): min(decay, (1 + t) / (10 + t)), so the
    average follows the first steps closely instead of holding on to the starting weights."""
    return min(decay, (1.0 + updates) / (10.0 + updates))


class WeightEma:
    """fp32 shadow copies of `module`'s trainable parameters, averaged after each update."""

    def __init__(self, module: torch.nn.Module, decay: float, warmup: bool = True):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        # Without warm-up every update uses `decay`: the average starts from the initial weights
        # and spans ~1/(1 - decay) updates from the first, where the warm-up caps it at ~t/10.
        self.warmup = warmup
        self.updates = 0
        self.params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        self.shadow = {name: local_part(p).detach().float().clone() for name, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> float:
        """Fold the current weights into the average; returns the decay it used."""
        d = warmed_decay(self.decay, self.updates) if self.warmup else self.decay
        for name, p in self.params.items():
            self.shadow[name].lerp_(local_part(p).float(), 1.0 - d)
        self.updates += 1
        return d

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """Inside, the module holds the averaged weights; its own are put back on exit."""
        saved = {name: local_part(p).clone() for name, p in self.params.items()}
        try:
            for name, p in self.params.items():
                local_part(p).copy_(self.shadow[name])
            yield
        finally:
            for name, p in self.params.items():
                local_part(p).copy_(saved[name])

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates,
                "shadow": {k: v.detach().cpu().clone() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict) -> None:
        if set(state["shadow"]) != set(self.shadow):
            missing, extra = set(self.shadow) - set(state["shadow"]), set(state["shadow"]) - set(self.shadow)
            raise ValueError(f"EMA state does not match the model: missing {sorted(missing)[:3]}, "
                             f"unexpected {sorted(extra)[:3]}")
        self.updates = int(state["updates"])
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)
