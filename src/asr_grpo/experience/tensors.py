"""Ragged per-sequence tensors <-> padded [B, T] batches."""
from __future__ import annotations

from typing import Sequence

import torch


def pad_ragged(rows: Sequence[torch.Tensor | Sequence[float]], width: int | None = None,
               value: float = 0.0) -> torch.Tensor:
    rows = [torch.as_tensor(r, dtype=torch.float32) for r in rows]
    width = max([len(r) for r in rows] + [1]) if width is None else width
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def unpad(batch: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    return [batch[i, :n].clone() for i, n in enumerate(lengths)]


def length_mask(lengths: Sequence[int], width: int | None = None) -> torch.Tensor:
    width = max(list(lengths) + [1]) if width is None else width
    return (torch.arange(width)[None, :] < torch.as_tensor(list(lengths))[:, None]).float()
