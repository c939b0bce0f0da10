"""MWER against a plain reference written here: per group, the softmax of the sequences'
summed log-probs over Python lists, times each error minus the group's mean error."""
import pytest
import torch

from asr_grpo.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, AdvantageInput, group_softmax, mwer_loss
from asr_grpo.config.schema import AlgorithmConfig


def close(actual, expected, atol=1e-9):
    torch.testing.assert_close(torch.as_tensor(actual).double(),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def sampled_groups(seed: int, n: int = 4, n_groups: int = 3, width: int = 7):
    """Random token log-probs of n ragged samples per group (wild values on padding) and
    each sample's edit error; the last group's errors are all equal."""
    g = torch.Generator().manual_seed(seed)
    rows = n * n_groups
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    logp = (-torch.rand(rows, width, generator=g, dtype=torch.float64) * 2).masked_fill(mask == 0, 50.0)
    err = torch.rand(rows, generator=g, dtype=torch.float64)
    err[-n:] = 0.25
    groups = torch.arange(n_groups).repeat_interleave(n)
    return logp.requires_grad_(), mask, err, groups


def advantages_from_errors(err, mask, n):
    """The path a run takes: the `dr_grpo` estimator over the score 1 - err."""
    adv, _ = ADVANTAGE_ESTIMATORS.get("dr_grpo").fn(AdvantageInput(1.0 - err, mask, group_size=n))
    return adv


def reference_mwer(logp, mask, err, groups, scale=1.0):
    """mean over groups of sum_i softmax_i(scale * sum_t logp_it) * (err_i - mean_j err_j)."""
    per_group = []
    for gid in sorted(set(groups.tolist())):
        members = [i for i in range(len(groups)) if groups[i] == gid]
        seq_logp = torch.stack([sum(logp[i, t] for t in range(mask.shape[1]) if mask[i, t]) for i in members])
        p = torch.softmax(scale * seq_logp, dim=0)
        errors = [float(err[i]) for i in members]
        mean_err = sum(errors) / len(errors)
        per_group.append(sum(p[k] * (errors[k] - mean_err) for k in range(len(members))))
    return torch.stack(per_group).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mwer_matches_the_reference_in_value_and_gradient(seed):
    logp, mask, err, groups = sampled_groups(seed)
    loss, metrics = mwer_loss(logp, advantages_from_errors(err, mask, 4), mask, groups)
    ref = reference_mwer(logp, mask, err, groups)
    close(loss, ref)
    close(torch.autograd.grad(loss, logp)[0], torch.autograd.grad(ref, logp)[0])
    assert 0.25 <= float(metrics["mwer_p_max"]) <= 1.0


def test_a_logp_scale_below_one_flattens_the_hypotheses_distribution():
    logp, mask, err, groups = sampled_groups(7)
    adv = advantages_from_errors(err, mask, 4)
    loss, flat = mwer_loss(logp, adv, mask, groups, logp_scale=0.1)
    ref = reference_mwer(logp, mask, err, groups, scale=0.1)
    close(loss, ref)
    close(torch.autograd.grad(loss, logp)[0], torch.autograd.grad(ref, logp)[0])
    _, sharp = mwer_loss(logp.detach(), adv, mask, groups)
    assert float(flat["mwer_p_max"]) < float(sharp["mwer_p_max"])
    algo = AlgorithmConfig(mwer_logp_scale=0.1)
    close(POLICY_LOSSES.get("mwer")(logp, logp.detach(), adv, mask, algo, groups=groups)[0], ref)


def test_the_gradient_is_p_times_error_minus_the_expected_error_on_every_real_token():
    logp, mask, err, groups = sampled_groups(3, n=5, n_groups=2)
    loss, _ = mwer_loss(logp, advantages_from_errors(err, mask, 5), mask, groups)
    grad, = torch.autograd.grad(loss, logp)
    seq_logp = (logp.detach() * mask).sum(-1)
    expected = torch.zeros(len(err), dtype=torch.float64)
    for gid in (0, 1):
        idx = groups == gid
        p = torch.softmax(seq_logp[idx], 0)
        expected[idx] = p * (err[idx] - (p * err[idx]).sum()) / 2   # / the number of groups
    close(grad, expected[:, None] * mask)


def test_an_all_equal_error_group_adds_no_loss_and_no_gradient():
    logp, mask, err, groups = sampled_groups(4)
    loss, _ = mwer_loss(logp, advantages_from_errors(err, mask, 4), mask, groups)
    grad, = torch.autograd.grad(loss, logp)
    assert not grad[groups == 2].any()
    # The flat group still counts in the mean over groups (it is in the batch, it just teaches nothing).
    close(loss, reference_mwer(logp, mask, err, groups))


def test_row_order_and_padding_do_not_matter():
    logp, mask, err, groups = sampled_groups(5)
    adv = advantages_from_errors(err, mask, 4)
    loss, _ = mwer_loss(logp, adv, mask, groups)
    perm = torch.randperm(len(groups), generator=torch.Generator().manual_seed(0))
    wider = lambda x, fill: torch.cat([x, torch.full((x.shape[0], 3), fill, dtype=x.dtype)], 1)  # noqa: E731
    shuffled, _ = mwer_loss(wider(logp.detach()[perm], -7.0), wider(adv[perm], 3.0), wider(mask[perm], 0),
                            groups[perm])
    close(shuffled, loss)


def test_group_softmax_leaves_out_rows_without_tokens():
    scores = torch.tensor([0.0, 1.0, 5.0, 2.0, 2.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, False, True, True])
    p = group_softmax(scores, groups, valid)
    e = torch.tensor([1.0, torch.e], dtype=torch.float64)
    close(p, [*(e / e.sum()).tolist(), 0.0, 0.5, 0.5])


def test_the_registered_loss_needs_groups_and_takes_no_importance_weights():
    logp, mask, err, groups = sampled_groups(6)
    adv = advantages_from_errors(err, mask, 4)
    mwer = POLICY_LOSSES.get("mwer")
    loss, metrics = mwer(logp, logp.detach(), adv, mask, AlgorithmConfig(), groups=groups)
    close(loss, mwer_loss(logp, adv, mask, groups)[0])
    close(metrics["approx_kl"], 0.0)   # on-policy: the old log-probs are the current ones
    with pytest.raises(ValueError, match="group"):
        mwer(logp, logp.detach(), adv, mask, AlgorithmConfig())
    with pytest.raises(ValueError, match="stale_is_correction"):
        mwer(logp, logp.detach(), adv, mask, AlgorithmConfig(), importance_weights=torch.ones_like(adv),
             groups=groups)
