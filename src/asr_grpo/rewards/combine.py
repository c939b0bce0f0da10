"""The typed reward result and the weighted combination of components."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from asr_grpo.rewards.components import REWARD_COMPONENTS, RewardSample


def combine(components: Mapping[str, torch.Tensor],
            weights: Mapping[str, float]) -> torch.Tensor:
    """total = sum_k w_k * c_k / sum_k w_k.

    Normalising by the weight sum keeps the total in the components' [0, 1] range
    whatever the weights' scale, so changing a weight changes the mix, not the reward
    scale the advantage/KL balance was tuned for. Components without a weight are
    left out of the total (they are still logged).
    """
    unknown = sorted(set(weights) - set(components))
    if unknown:
        raise KeyError(f"reward weights name unknown components {unknown}; "
                       f"known: {sorted(components)}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"reward weights must be >= 0 with a positive sum, got {dict(weights)}")
    total = sum(float(w) * components[k].double() for k, w in weights.items())
    return (total / sum(weights.values())).float()


@dataclass
class RewardResult:
    """Rewards for N samples: `total` is what RL optimises, `components` the per-part
    scores (OpenRLHF's extra_logs), `scores` what dynamic filtering looks at, `keep`
    False for samples a drop policy removed (their values are 0, never NaN)."""
    total: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: torch.Tensor | None = None
    keep: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.total)
        if self.scores is None:
            self.scores = self.total
        if self.keep is None:
            self.keep = torch.ones(n, dtype=torch.bool)
        for name, t in {"scores": self.scores, "keep": self.keep, **self.components}.items():
            if t.shape != (n,):
                raise ValueError(f"reward {name!r} has shape {tuple(t.shape)}, expected ({n},)")

    def __len__(self) -> int:
        return len(self.total)

    @property
    def num_dropped(self) -> int:
        return int((~self.keep).sum())

    @classmethod
    def dropped(cls, n: int) -> "RewardResult":
        """N samples a drop policy removed as a whole (zeros, keep=False)."""
        return cls(total=torch.zeros(n), keep=torch.zeros(n, dtype=torch.bool))

    @classmethod
    def cat(cls, parts: Sequence["RewardResult"]) -> "RewardResult":
        """Concatenate results of consecutive sample shards (e.g. one per reward worker).
        A shard dropped whole may lack components: they are 0 there."""
        names = list(dict.fromkeys(k for p in parts for k in p.components))

        def component(p: "RewardResult", name: str) -> torch.Tensor:
            if name in p.components:
                return p.components[name]
            if p.keep.any():
                raise ValueError(f"reward component {name!r} is missing from a shard with kept samples")
            return torch.zeros(len(p))

        return cls(total=torch.cat([p.total for p in parts]),
                   scores=torch.cat([p.scores for p in parts]),
                   keep=torch.cat([p.keep for p in parts]),
                   components={k: torch.cat([component(p, k) for p in parts]) for k in names})

    def select(self, index: Sequence[int]) -> "RewardResult":
        """The samples at `index`, in that order."""
        return RewardResult(total=self.total[index], scores=self.scores[index], keep=self.keep[index],
                            components={k: v[index] for k, v in self.components.items()})

    def log(self, prefix: str = "reward/", labels: Sequence[str] | None = None) -> dict[str, float]:
        """Means over the kept samples of the total and every component, plus the
        number of dropped samples. With `labels` (one per sample, e.g. its language) also
        the means per label, under `{prefix}{name}/{label}`."""
        keep = self.keep
        out = {f"{prefix}total": _mean(self.total[keep])}
        out.update({f"{prefix}{k}": _mean(v[keep]) for k, v in self.components.items()})
        out[f"{prefix}dropped"] = float(self.num_dropped)
        for label in dict.fromkeys(labels or ()):
            sel = keep & torch.tensor([x == label for x in labels])
            out.update({f"{prefix}{k}/{label}": _mean(v[sel])
                        for k, v in {"total": self.total, **self.components}.items()})
        return out

    def to_dict(self) -> dict:
        """Plain lists, for crossing a Ray boundary without shipping tensors."""
        return {"total": self.total.tolist(), "scores": self.scores.tolist(),
                "keep": self.keep.tolist(),
                "components": {k: v.tolist() for k, v in self.components.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> "RewardResult":
        f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
        return cls(total=f(d["total"]), scores=f(d["scores"]),
                   keep=torch.tensor(d["keep"], dtype=torch.bool),
                   components={k: f(v) for k, v in d["components"].items()})


def _mean(t: torch.Tensor) -> float:
    return float(t.mean()) if len(t) else 0.0


def score_samples(samples: Sequence[RewardSample],
                  weights: Mapping[str, float]) -> RewardResult:
    """Compute every registered component for each sample and combine them."""
    components = {name: torch.tensor([fn(s) for s in samples], dtype=torch.float32)
                  for name, fn in REWARD_COMPONENTS.items()}
    return RewardResult(total=combine(components, weights), components=components)
