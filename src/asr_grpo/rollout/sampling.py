"""Per-sequence seeded sampling: a token depends only on (seed, sequence uid, position)
and the logits, never on which other sequences share the batch. That is what lets a
chunked or carried-over rollout reproduce the tokens of a one-shot rollout.

Each row's draw is an integer hash of its (seed, uid, position) key, computed for the
whole batch at once on the logits' device in exact integer arithmetic: the same number
on any device, and no per-row generator (those cost ~9 ms a decode round for 96 rows,
most of a decode round on a GPU)."""
from __future__ import annotations

import zlib
from typing import Sequence

import torch


def token_seed(seed: int, uid: str, position: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(uid.encode()) * 7_919 + position) % (2**63 - 1)


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for int64 x < 2**32, in 16-bit halves of c so that no product
    leaves int64 (signed overflow is undefined behaviour in the kernels)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer: xorshift-multiply rounds (the 'lowbias32' constants)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_uniform(keys: torch.Tensor) -> torch.Tensor:
    """One U(0, 1) draw per key (float64, never 0 or 1), a pure function of the key
    (non-negative int64 seeds): the same number on any device and in any batch."""
    keys = keys.to(torch.int64)
    bits = _hash32(_hash32(_hash32(keys & _MASK32) ^ (keys >> 32)) ^ 0x5BD1E995)
    return (bits.to(torch.float64) + 0.5) * 2.0**-32


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass before it already reaches top_p (the top token always stays).
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float, seed: int, *,
                  uids: Sequence[str], positions: Sequence[int],
                  suppress: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens [B], behaviour log-probs [B]).

    One seeded uniform per row, inverted through the row's CDF; `suppress` ids are never
    drawn. The log-prob is under the temperature-scaled full distribution (before top-p
    and suppression), the one the trainer recomputes, so PPO ratios compare like with like.
    """
    logits = logits.float()
    scaled = logits / temperature if temperature > 0.0 else logits
    allowed = scaled if suppress is None or not len(suppress) else scaled.index_fill(
        -1, suppress.to(scaled.device), float("-inf"))
    if temperature <= 0.0:
        tokens = allowed.argmax(dim=-1)
        return tokens, scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    filtered = top_p_filter(allowed, top_p)
    keys = torch.tensor([token_seed(seed, uid, pos) for uid, pos in zip(uids, positions)],
                        dtype=torch.int64, device=filtered.device)
    # Inverse-CDF draw, in float64 so the draw stays strictly below the total mass: the
    # token is the first whose cumulative probability exceeds it (never a masked one).
    cdf = filtered.softmax(dim=-1).to(torch.float64).cumsum(dim=-1)
    draw = seeded_uniform(keys) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, draw[:, None], right=True).squeeze(-1)
    logprobs = scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
