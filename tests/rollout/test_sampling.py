"""The seeded sampler draws from the distribution it is given, independently per draw,
and each draw is a function of its own key alone."""
from __future__ import annotations

import torch

from asr_grpo.rollout import sample_tokens
from asr_grpo.rollout.sampling import seeded_uniform

N = 30_000


def _within(freq: torch.Tensor, probs: torch.Tensor, n: int, sigmas: float = 4.5) -> bool:
    """Every empirical frequency within `sigmas` binomial standard errors of its probability."""
    se = (probs * (1 - probs) / n).sqrt().clamp(min=1e-12)
    return bool(((freq - probs).abs() <= sigmas * se + 1e-12).all())


def _draw(logits_row: torch.Tensor, n: int, *, temperature=1.0, top_p=1.0, suppress=None, positions=None):
    logits = logits_row.expand(n, -1)
    uids = [f"utt{i}" for i in range(n)]
    return sample_tokens(logits, temperature, top_p, 3, uids=uids, positions=positions or [0] * n,
                         suppress=suppress)[0]


def test_draws_follow_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    for temperature in (1.0, 0.6):
        tokens = _draw(logits, N, temperature=temperature)
        freq = torch.bincount(tokens, minlength=6).double() / N
        assert _within(freq, (logits / temperature).softmax(-1).double(), N), (temperature, freq)


def test_top_p_and_suppressed_tokens_are_never_drawn_and_the_rest_keep_their_ratios():
    probs = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    tokens = _draw(probs.log(), N, top_p=0.8, suppress=torch.tensor([1]))
    freq = torch.bincount(tokens, minlength=5).double() / N
    assert freq[1] == 0 and freq[3] == 0 and freq[4] == 0        # suppressed; outside the top-p set
    kept = torch.tensor([0.4, 0.0, 0.2, 0.0, 0.0], dtype=torch.float64)
    assert _within(freq, kept / kept.sum(), N)


def test_positions_of_one_sequence_draw_independently():
    """Token pairs at consecutive positions of the same sequence: every pair as often as
    the product of the marginals (a correlated key stream would skew the diagonal)."""
    n = N // 2
    logits = torch.zeros(1, 2).expand(n, -1)
    uids = [f"s{i}" for i in range(n)]
    first = sample_tokens(logits, 1.0, 1.0, 11, uids=uids, positions=[4] * n)[0]
    second = sample_tokens(logits, 1.0, 1.0, 11, uids=uids, positions=[5] * n)[0]
    pairs = torch.bincount(first * 2 + second, minlength=4).double() / n
    assert _within(pairs, torch.full((4,), 0.25, dtype=torch.float64), n), pairs


def test_each_draw_depends_on_its_key_alone():
    keys = torch.tensor([0, 1, 2**31, 2**32 + 5, 2**62 + 17], dtype=torch.int64)
    together = seeded_uniform(keys)
    alone = torch.cat([seeded_uniform(keys[i:i + 1]) for i in range(len(keys))])
    assert torch.equal(together, alone)
    assert ((together > 0) & (together < 1)).all()
    assert len(set(together.tolist())) == len(keys)
    # Keys that differ only above bit 32 (a high-order part of the seed) still differ.
    assert seeded_uniform(torch.tensor([7]))[0] != seeded_uniform(torch.tensor([7 + 2**40]))[0]
