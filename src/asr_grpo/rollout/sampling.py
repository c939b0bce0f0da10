"""Per-sequence seeded sampling: a token depends only on (seed, sequence uid, position)
and the logits, never on which other sequences share the batch. That is what lets a
chunked or carried-over rollout reproduce the tokens of a one-shot rollout."""
from __future__ import annotations

import zlib
from typing import Sequence

import torch


def token_seed(seed: int, uid: str, position: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(uid.encode()) * 7_919 + position) % (2**63 - 1)


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

    Gumbel-max with per-row generators. `suppress` ids are never drawn. The log-prob
    is under the temperature-scaled full distribution (before top-p and suppression),
    the one the trainer recomputes, so PPO ratios compare like with like.
    """
    logits = logits.float()
    scaled = logits / temperature if temperature > 0.0 else logits
    allowed = scaled if suppress is None or not len(suppress) else scaled.index_fill(-1, suppress, float("-inf"))
    if temperature <= 0.0:
        tokens = allowed.argmax(dim=-1)
        return tokens, scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    filtered = top_p_filter(allowed, top_p)
    noise = torch.empty_like(filtered)
    for row, (uid, pos) in enumerate(zip(uids, positions)):
        gen = torch.Generator().manual_seed(token_seed(seed, uid, pos))
        u = torch.rand(filtered.shape[-1], generator=gen).clamp_(1e-20, 1.0)
        noise[row] = -torch.log(-torch.log(u))
    tokens = (filtered + noise).argmax(dim=-1)
    logprobs = scaled.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
