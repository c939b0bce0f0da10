"""GSPO and GSPO-token against a plain per-sequence reference written here: Python loops
over each sequence's real tokens, autograd for the gradients."""
import math

import pytest
import torch

from asr_grpo.algorithms import POLICY_LOSSES, gspo_loss, gspo_token_loss, sequence_log_ratio
from asr_grpo.config.schema import AlgorithmConfig

EPS_LOW, EPS_HIGH = 3e-4, 4e-4


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(torch.as_tensor(actual).double(),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def ragged_batch(seed: int, lengths=(5, 3, 1, 4, 0, 2, 6, 3, 2, 5, 1, 4), width=6, scale=3e-3):
    """Random log-probs and old log-probs close to them (so some sequence ratios fall inside
    GSPO's tiny clip range and some outside), per-sequence advantages on every real token,
    padding holding wild values the losses must ignore, and one empty row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    old = -torch.rand(len(lengths), width, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(len(lengths), width, generator=g, dtype=torch.float64) * scale
    seq_adv = torch.randn(len(lengths), generator=g, dtype=torch.float64)
    adv = seq_adv[:, None] * mask
    pad = mask == 0
    logp, old, adv = logp.masked_fill(pad, 40.0), old.masked_fill(pad, -40.0), adv.masked_fill(pad, 99.0)
    return logp.requires_grad_(), old, adv, mask


def reference_gspo(logp, old, adv, mask, eps_low, eps_high, weights=None):
    """mean over non-empty sequences of max(-A s, -A clip(s)), s = exp(mean_t(logp - old))."""
    losses, clipped = [], []
    for i in range(mask.shape[0]):
        real = [t for t in range(mask.shape[1]) if mask[i, t]]
        if not real:
            continue
        log_s = sum(logp[i, t] - old[i, t] for t in real) / len(real)
        s = torch.exp(log_s)
        a = adv[i, real[0]]
        unclipped, clipped_term = -a * s, -a * s.clamp(1 - eps_low, 1 + eps_high)
        loss = torch.maximum(unclipped, clipped_term)
        if weights is not None:   # the geometric mean of the sequence's token weights
            loss = loss * math.exp(sum(math.log(float(weights[i, t])) for t in real) / len(real))
        losses.append(loss)
        clipped.append(bool(clipped_term > unclipped))
    return torch.stack(losses).mean(), sum(clipped) / len(clipped)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_matches_the_reference_in_value_gradient_and_clip_fraction(seed):
    logp, old, adv, mask = ragged_batch(seed)
    loss, m = gspo_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH)
    grad, = torch.autograd.grad(loss, logp)
    ref_loss, ref_clip = reference_gspo(logp, old, adv, mask, EPS_LOW, EPS_HIGH)
    ref_grad, = torch.autograd.grad(ref_loss, logp)
    close(loss, ref_loss)
    close(grad, ref_grad)
    close(m["clip_frac"], ref_clip, atol=1e-6)   # a float32 count
    assert 0 < ref_clip < 1, "the batch should clip some sequences and not others"
    assert torch.equal(grad[mask == 0], torch.zeros(int((mask == 0).sum()), dtype=grad.dtype))


def test_gspo_ratio_is_the_length_normalised_sequence_ratio():
    logp, old, adv, mask = ragged_batch(3)
    s = torch.exp(sequence_log_ratio(logp, old, mask)).detach()
    by_hand = [math.exp(float((logp.detach()[i, :n] - old[i, :n]).sum()) / n) if n else 1.0
               for i, n in enumerate(mask.sum(-1).tolist())]
    close(s, by_hand)
    _, m = gspo_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH)
    real_rows = mask.sum(-1) > 0
    close(m["ratio_mean"], s[real_rows].mean())
    close(m["ratio_max"], s[real_rows].max())


def test_gspo_stale_weights_enter_as_their_geometric_mean_per_sequence():
    logp, old, adv, mask = ragged_batch(4)
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64) + 0.5
    loss, _ = gspo_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH, importance_weights=w)
    ref_loss, _ = reference_gspo(logp, old, adv, mask, EPS_LOW, EPS_HIGH, weights=w)
    close(loss, ref_loss)


def test_gspo_token_with_sequence_advantages_is_gspo_in_value_and_gradient():
    logp, old, adv, mask = ragged_batch(5)
    seq, _ = gspo_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH)
    tok, m = gspo_token_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH, loss_agg="seq_mean_token_mean")
    close(tok, seq)
    close(torch.autograd.grad(tok, logp)[0], torch.autograd.grad(seq, logp)[0])
    # Every token of a sequence carries the sequence's ratio.
    s = torch.exp(sequence_log_ratio(logp, old, mask)).detach()
    close(m["ratio_max"], s[mask.sum(-1) > 0].max())


def test_gspo_token_gradient_is_the_sequence_ratio_times_each_tokens_own_advantage():
    logp, old, _, mask = ragged_batch(6, scale=1e-5)   # every sequence ratio inside the clip range
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * mask
    loss, m = gspo_token_loss(logp, old, adv, mask, EPS_LOW, EPS_HIGH, loss_agg="seq_mean_token_mean")
    grad, = torch.autograd.grad(loss, logp)
    s = torch.exp(sequence_log_ratio(logp, old, mask)).detach()
    lengths = mask.sum(-1).clamp_min(1)
    rows = int((mask.sum(-1) > 0).sum())
    close(loss, sum(float((-adv[i] * s[i] * mask[i]).sum()) / int(lengths[i]) for i in range(len(s))) / rows)
    close(grad, -adv * s[:, None] / lengths[:, None] / rows * mask)
    close(m["clip_frac"], 0.0)


def test_a_group_of_equal_rewards_gives_no_loss_and_no_gradient():
    logp, old, _, mask = ragged_batch(7)
    zero = torch.zeros(mask.shape, dtype=torch.float64)
    for loss, _ in (gspo_loss(logp, old, zero, mask, EPS_LOW, EPS_HIGH),
                    gspo_token_loss(logp, old, zero, mask, EPS_LOW, EPS_HIGH)):
        close(loss, 0.0)
        assert not torch.autograd.grad(loss, logp)[0].any()


def test_the_registered_losses_read_the_gspo_clip_range_of_the_config():
    logp, old, adv, mask = ragged_batch(8)
    algo = AlgorithmConfig(gspo_eps_clip_low=1e-3, gspo_eps_clip_high=2e-3, dual_clip=None,
                           loss_agg="seq_mean_token_mean")
    for name, direct in (("gspo", gspo_loss(logp, old, adv, mask, 1e-3, 2e-3)),
                         ("gspo_token", gspo_token_loss(logp, old, adv, mask, 1e-3, 2e-3))):
        loss, metrics = POLICY_LOSSES.get(name)(logp, old, adv, mask, algo)
        close(loss, direct[0])
        assert set(metrics) == {"clip_frac", "dual_clip_frac", "ratio_mean", "ratio_max", "approx_kl"}
