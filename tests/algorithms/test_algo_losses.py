import math

import pytest
import torch

from asr_grpo.algorithms import (
    aggregate_loss,
    entropy_from_logits,
    explained_variance,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
    policy_loss,
    truncated_importance_weights,
    value_loss,
)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual).double(),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def logps(ratios):
    """(logp leaf with grad, old_logp) giving the requested ratios."""
    old = torch.full((1, len(ratios)), -1.0, dtype=torch.float64)
    logp = (old + torch.log(torch.tensor([ratios], dtype=torch.float64))).requires_grad_()
    return logp, old


# --- aggregation -----------------------------------------------------------------

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # ragged + one empty row


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", (1 + 2 + 3 + 4) / 4),
    ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),  # empty row skipped
    ("seq_mean_token_sum", (6 + 4) / 2),
    ("seq_mean_token_sum_norm", (6 + 4) / 2 / 8),  # Dr. GRPO: over the constant 8, not the lengths
])
def test_aggregate_modes(mode, expected):
    close(aggregate_loss(LOSS, MASK, mode, norm_tokens=8), expected)


def test_the_constant_normaliser_weighs_every_token_alike_whatever_its_sequences_length():
    # One token's gradient is 1 / (rows * norm_tokens) in a 1-token and in a 3-token sequence,
    # where seq_mean_token_mean would give the short sequence's token 3x the weight.
    loss_mat = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    aggregate_loss(loss_mat, mask, "seq_mean_token_sum_norm", norm_tokens=16).backward()
    close(loss_mat.grad, mask / (2 * 16))
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregate_loss(LOSS, MASK, "seq_mean_token_sum_norm")


def test_aggregate_unknown_mode_and_masked_helpers():
    with pytest.raises(ValueError, match="seq_mean_token_sum"):
        aggregate_loss(LOSS, MASK, "sum")
    close(masked_mean(LOSS, MASK, dim=-1), [2.0, 4.0, 0.0])
    w = masked_whiten(LOSS, MASK)
    real = w[MASK.bool()]
    close(real.mean(), 0.0)
    close(real.var(), 1.0, atol=1e-6)  # unbiased, like masked_var
    assert torch.equal(w[~MASK.bool()], torch.zeros(5))


# --- policy loss -------------------------------------------------------------------

def test_policy_loss_without_clipping_is_minus_adv_times_ratio():
    logp, old = logps([1.1, 0.9])
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 2), 0.2, 0.28)
    close(loss, (-2.0 * 1.1 + 1.0 * 0.9) / 2)
    close(m["clip_frac"], 0.0)
    close(m["ratio_mean"], 1.0)
    close(m["ratio_max"], 1.1)
    k3 = [r - 1 - math.log(r) for r in (1.1, 0.9)]  # KL(old || new), k3 form
    close(m["approx_kl"], sum(k3) / 2)


def test_policy_loss_asymmetric_clipping_and_gradients():
    # ratio clipped to [0.8, 1.28]; only the pessimistic side clips.
    ratios = [1.5, 1.2, 0.5, 0.9, 0.5, 1.5]
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    per_token = [-1.28, -1.2, 0.8, 0.9, -0.5, 1.5]
    clipped = [True, False, True, False, False, False]
    logp, old = logps(ratios)
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 6), eps_clip_low=0.2, eps_clip_high=0.28)
    close(loss, sum(per_token) / 6)
    close(m["clip_frac"], 2 / 6)
    loss.backward()
    # d(-A*rho)/d logp = -A*rho on unclipped tokens, 0 on clipped ones.
    expected = [0.0 if c else -a * r / 6 for c, a, r in zip(clipped, adv[0].tolist(), ratios)]
    close(logp.grad[0], expected)


def test_policy_loss_dual_clip():
    ratios = [math.exp(5.0), 2.0, math.exp(5.0)]
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    logp, old = logps(ratios)
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 3), 0.2, 0.28, dual_clip=3.0)
    # token 0: min(148.4, 3) = 3 (dual); token 1: 2 < 3; token 2: clipped to -1.28.
    close(loss, (3.0 + 2.0 - 1.28) / 3)
    close(m["dual_clip_frac"], 1 / 3)
    close(m["clip_frac"], 1 / 3)
    loss.backward()
    close(logp.grad[0], [0.0, 2.0 / 3, 0.0])
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv, torch.ones(1, 3), 0.2, 0.28, dual_clip=1.0)


def test_policy_loss_mask_weights_and_agg():
    logp, old = logps([1.1, 0.9, 50.0])  # last token is padding with a wild ratio
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    w = torch.tensor([[0.5, 2.0, 1.0]], dtype=torch.float64, requires_grad=True)
    loss, m = policy_loss(logp, old, adv, mask, 0.2, 0.28, importance_weights=w,
                          loss_agg="seq_mean_token_sum")
    close(loss, -1.1 * 0.5 - 0.9 * 2.0)
    close(m["ratio_max"], 1.1)
    close(m["clip_frac"], 0.0)
    loss.backward()
    assert w.grad is None


# --- value loss ---------------------------------------------------------------------

def test_value_loss_clipping():
    values = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.0, 2.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0: max((1-2)^2, (0.2-2)^2) = 3.24 (clipped); token 1: 4 (v == old).
    loss, m = value_loss(values, old, returns, mask, value_clip=0.2)
    close(loss, 0.5 * (3.24 + 4.0) / 2)
    close(m["value_clip_frac"], 0.5)
    loss.backward()
    close(values.grad[0], [0.0, 0.5 * 2 * 2.0 / 2, 0.0])
    loss, m = value_loss(values, old, returns, mask)
    close(loss, 0.5 * (1.0 + 4.0) / 2)
    close(m["value_clip_frac"], 0.0)


def test_explained_variance():
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]])
    close(explained_variance(returns, returns, mask), 1.0)
    close(explained_variance(torch.full_like(returns, 7.0), returns, mask), 0.0)
    # Var[R-V] = Var[0,0,0,1] = 0.25, Var[R] = 5/3 (unbiased both) -> 1 - 0.15
    close(explained_variance(torch.tensor([[1.0, 2.0, 3.0, 3.0, 0.0]]), returns, mask), 0.85)
    ev = explained_variance(torch.randn(1, 5), torch.full((1, 5), 2.0), mask)
    close(ev, 0.0)


# --- logits utilities -----------------------------------------------------------------

def test_entropy_and_logprobs():
    close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))
    close(entropy_from_logits(torch.full((1, 1, 7), 1e4)), [[math.log(7)]], atol=1e-5)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g) * 4
    tokens = torch.randint(0, 11, (2, 3), generator=g)
    dist = torch.distributions.Categorical(logits=logits)
    close(entropy_from_logits(logits), dist.entropy(), atol=1e-5)
    close(logprobs_from_logits(logits, tokens), dist.log_prob(tokens), atol=1e-5)
    assert logprobs_from_logits(logits.bfloat16(), tokens).dtype == torch.float32


def test_truncated_importance_weights():
    a = torch.tensor([math.log(0.5), math.log(3.0), 0.0, 100.0], requires_grad=True)
    w = truncated_importance_weights(a, torch.zeros(4), clip=2.0)
    close(w, [0.5, 2.0, 1.0, 2.0])
    assert not w.requires_grad
