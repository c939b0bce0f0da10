"""Placement plans (pure) and their realisation on a local Ray with 4 logical GPUs."""
import os
import time
from dataclasses import replace

import pytest
import ray

from asr_grpo.config.schema import PlacementConfig
from asr_grpo.distributed.placement import PlacementError, create_placement_group, plan_placement, role_counts

# The actor with a quarter-GPU reference beside it (conf/placement/colocate.yaml gives it 0.1).
COLOCATE = PlacementConfig(colocate=True, gpus_per_node=4, ref_gpus=0.25)
SEPARATE = PlacementConfig(name="separate", colocate=False, gpus_per_node=4, actor_gpus=1.0,
                           ref_gpus=1.0, critic_gpus=1.0, reward_gpus=0.0, rollout_gpus=1.0)


def bundles_of(plan, role):
    return [s.bundle_index for s in plan.ranks(role)]


# -- pure plans -------------------------------------------------------------------------
def test_colocate_pairs_actor_and_ref_rank_on_one_bundle():
    plan = plan_placement(COLOCATE, {"actor": 2, "ref": 2, "critic": 0, "reward": 1})
    assert len(plan.bundles) == 2 and plan.bundles[0] == {"GPU": 1.0}
    assert bundles_of(plan, "actor") == bundles_of(plan, "ref") == [0, 1]
    assert [s.num_gpus for s in plan.ranks("actor")] == [0.75, 0.75]
    assert [s.num_gpus for s in plan.ranks("ref")] == [0.25, 0.25]
    assert sum(s.num_gpus for s in plan.on_bundle(0)) == 1.0
    # reward runs a Python function: CPU-only when colocated, outside the group
    assert [(s.bundle_index, s.num_gpus) for s in plan.ranks("reward")] == [(None, 0.0)]
    assert plan.ranks("critic") == () and plan.warnings == ()


def test_half_half_is_flagged_with_the_reason():
    cfg = replace(COLOCATE, actor_gpus=0.5, ref_gpus=0.5)
    plan = plan_placement(cfg, {"actor": 2, "ref": 2})
    assert bundles_of(plan, "actor") == [0, 1]        # still valid: ranks are pinned
    text = " ".join(plan.warnings)
    assert "placement.actor_gpus=0.5" in text and "two actor ranks fit on one bundle" in text
    assert "0.75/0.25" in text


def test_fractions_over_one_gpu_name_the_keys():
    with pytest.raises(ValueError, match=r"bundle 0 would carry placement\.actor_gpus=0\.75 \+ "
                       r"placement\.ref_gpus=0\.25 \+ placement\.rollout_gpus=0\.25 = 1\.25"):
        plan_placement(COLOCATE, {"actor": 1, "ref": 1, "rollout": 1})
    with pytest.raises(ValueError, match=r"placement\.critic_gpus=1\.5 is outside \[0, 1\]"):
        plan_placement(replace(COLOCATE, critic_gpus=1.5), {"actor": 1, "critic": 1})
    with pytest.raises(ValueError, match=r"unknown role\(s\) \['policy'\]"):
        plan_placement(COLOCATE, {"policy": 1})


def test_separate_gives_each_role_disjoint_bundles():
    plan = plan_placement(SEPARATE, {"actor": 2, "ref": 1, "reward": 2, "rollout": 1})
    assert len(plan.bundles) == 4
    assert bundles_of(plan, "actor") == [0, 1]
    assert bundles_of(plan, "ref") == [2] and bundles_of(plan, "rollout") == [3]
    assert bundles_of(plan, "reward") == [None, None]     # reward_gpus=0: CPU-only
    # with reward_gpus > 0, reward workers get bundles of their own
    gpu_reward = plan_placement(replace(SEPARATE, reward_gpus=1.0, gpus_per_node=8),
                                {"actor": 1, "reward": 2, "rollout": 1})
    assert bundles_of(gpu_reward, "reward") == [1, 2] and bundles_of(gpu_reward, "rollout") == [3]


def test_too_many_bundles_is_rejected_before_ray():
    with pytest.raises(ValueError, match=r"needs 5 GPU bundle\(s\) \(separate: actor 2 \+ ref 2"
                       r" \+ rollout 1\) but placement\.num_nodes \* placement\.gpus_per_node"
                       r" = 1 \* 4 = 4"):
        plan_placement(SEPARATE, {"actor": 2, "ref": 2, "rollout": 1})
    with pytest.raises(ValueError, match=r"needs 3 GPU bundle\(s\) \(colocated: max\(actor 3, "
                       r"ref 3\) = 3\).* = 1 \* 2 = 2"):
        plan_placement(replace(COLOCATE, gpus_per_node=2), {"actor": 3, "ref": 3})


def test_role_counts_follow_the_config():
    cfg = replace(COLOCATE, actor_num_ranks=2, rollout_num_workers=3, reward_num_workers=1)
    assert role_counts(cfg, use_critic=True) == {
        "actor": 2, "ref": 2, "critic": 2, "reward_model": 0, "reward": 1, "rollout": 3}
    assert role_counts(cfg, use_critic=False, use_ref=False)["critic"] == 0
    assert role_counts(cfg, use_critic=False, use_reward_model=True)["reward_model"] == 2


def test_role_cpus_go_to_the_ranks_and_the_bundles_that_carry_them():
    plan = plan_placement(replace(COLOCATE, role_cpus={"actor": 2, "ref": 0.5}), {"actor": 2, "ref": 2, "reward": 1})
    assert plan.bundles == ({"GPU": 1.0, "CPU": 2.5},) * 2
    assert [s.num_cpus for s in plan.ranks("actor")] == [2.0, 2.0] and plan.ranks("ref")[0].num_cpus == 0.5
    # a role left out keeps its default; a CPU-only rank takes its CPUs outside the group
    assert [(s.bundle_index, s.num_cpus) for s in plan.ranks("reward")] == [(None, 1.0)]
    assert "bundle 0 (2.5 CPU)" in plan.describe() and "reward[0] (1 CPU)" in plan.describe()
    sep = plan_placement(replace(SEPARATE, role_cpus={"rollout": 1}), {"actor": 1, "ref": 1, "rollout": 1})
    assert sep.bundles == ({"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0, "CPU": 1.0})
    with pytest.raises(ValueError, match=r"placement\.role_cpus names unknown role\(s\) \['policy'\]"):
        plan_placement(replace(COLOCATE, role_cpus={"policy": 1}), {"actor": 1})
    with pytest.raises(ValueError, match=r"placement\.role_cpus must be finite CPU counts >= 0, got \{'ref': -1\.0\}"):
        plan_placement(replace(COLOCATE, role_cpus={"ref": -1}), {"actor": 1, "ref": 1})


@pytest.mark.parametrize("overrides", [[], ["algorithm=ppo"], ["reward=asr_lm"], ["placement=separate"],
                                       ["placement=separate", "algorithm=ppo"]], ids=" ".join)
def test_the_shipped_runs_fit_a_two_core_ray(overrides, tmp_path):
    """What rl.py plans for the shipped configs reserves at most 2 CPUs: `ray.init(num_cpus=2)`."""
    from helpers import compose_cfg

    from asr_grpo.workers.rollout import rollout_ranks

    cfg = compose_cfg(tmp_path, *overrides)
    counts = role_counts(cfg.placement, use_critic=cfg.algorithm.use_critic, use_ref=cfg.algorithm.kl_coef > 0,
                         use_reward_model=cfg.reward.smoothness_scorer == "lm")
    counts["rollout"] = rollout_ranks(cfg)
    plan = plan_placement(cfg.placement, counts)
    cpus = sum(b.get("CPU", 0.0) for b in plan.bundles) + sum(
        s.num_cpus for ss in plan.slots.values() for s in ss if s.bundle_index is None)
    assert 0 < cpus <= 2, plan.describe()


# -- on a local Ray with 4 logical GPUs -------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray
    summary = start_ray(PlacementConfig(gpus_per_node=4), num_cpus=2, log_to_driver=False)
    yield summary
    shutdown_ray()


def probe_cls():
    # Defined in a function so cloudpickle ships it by value (the test module itself is
    # not importable by the Ray workers).
    from asr_grpo.distributed.role_group import DIST_ENV_KEYS, RoleBase

    class Probe(RoleBase):
        def __init__(self, tag):
            self.tag = tag
            self.env_at_init = {k: os.environ.get(k) for k in DIST_ENV_KEYS}

        def echo(self, x, suffix=""):
            return f"{self.tag}:{x}{suffix}"

        def env(self):
            return self.env_at_init
    return Probe


@pytest.fixture
def groups():
    """Collects RoleGroups and the placement group so they are freed after each test."""
    made = {"groups": [], "pg": None}
    yield made
    for g in made["groups"]:
        g.kill()
    if made["pg"] is not None:
        ray.util.remove_placement_group(made["pg"])


def start_roles(groups, plan, roles, timeout_s=120):
    from asr_grpo.distributed.role_group import RoleGroup
    groups["pg"] = create_placement_group(plan, timeout_s=timeout_s)
    out = {r: RoleGroup(r, probe_cls(), plan, groups["pg"], init_args=(r,), timeout_s=timeout_s)
           for r in roles}
    groups["groups"] += out.values()
    return out


@pytest.mark.slow
def test_local_ray_is_loopback_with_logical_gpus(local_ray):
    from asr_grpo.distributed.ray_cluster import start_ray
    assert local_ray["logical_gpus"] is True and local_ray["resources"]["GPU"] == 4
    assert local_ray["loopback_only"] and local_ray["address"].startswith("127.0.0.1:")
    again = start_ray(PlacementConfig(gpus_per_node=4))
    assert again["reused"] and again["address"] == local_ray["address"]


@pytest.mark.slow
def test_colocated_ranks_share_bundles_as_read_back_from_ray(local_ray, groups):
    plan = plan_placement(COLOCATE, {"actor": 2, "ref": 2})
    roles = start_roles(groups, plan, ["actor", "ref"])
    seen = {r: g.placement_report() for r, g in roles.items()}
    for r in ("actor", "ref"):
        for rep in seen[r]:
            assert rep["as_planned"], rep
            assert rep["node_id"] == rep["bundle_node_id"]
            assert rep["placement_group_id"] == groups["pg"].id.hex()
    actor_bundles = [rep["bundle_index"] for rep in seen["actor"]]
    assert actor_bundles == [rep["bundle_index"] for rep in seen["ref"]] == [0, 1]
    assert [rep["assigned_resources"] for rep in seen["actor"]] == [{"GPU": 0.75}] * 2
    assert [rep["assigned_resources"] for rep in seen["ref"]] == [{"GPU": 0.25}] * 2
    # one logical GPU per bundle: actor i and ref i see the same device, actors different
    assert [rep["gpu_ids"] for rep in seen["actor"]] == [rep["gpu_ids"] for rep in seen["ref"]]
    assert seen["actor"][0]["gpu_ids"] != seen["actor"][1]["gpu_ids"]

    actor = roles["actor"]
    env = ray.get(actor.call("env"))
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in env] == [
        ("0", "2", "0"), ("1", "2", "0")]
    assert {e["MASTER_ADDR"] for e in env} == {"127.0.0.1"}
    assert {e["MASTER_PORT"] for e in env} == {str(actor.master_port)}
    assert roles["ref"].master_port != actor.master_port      # one rendezvous per role
    assert ray.get(actor.call("echo", 1, suffix="!")) == ["actor:1!", "actor:1!"]
    assert ray.get(actor.call_split("echo", ["a", "b"])) == ["actor:a", "actor:b"]
    assert ray.get(actor.call_rank(1, "echo", "z")) == "actor:z"
    assert ray.get(actor.call_rank(0, "placement_info"))["bundle_index"] == 0   # RoleBase
    with pytest.raises(ValueError, match="1 per-rank arguments for 2 ranks"):
        actor.call_split("echo", ["a"])


@pytest.mark.slow
def test_separate_roles_hold_disjoint_bundles_as_read_back_from_ray(local_ray, groups):
    plan = plan_placement(SEPARATE, {"actor": 2, "ref": 1, "reward": 1, "rollout": 1})
    roles = start_roles(groups, plan, ["actor", "ref", "reward", "rollout"])
    used = {r: [rep["bundle_index"] for rep in g.placement_report()] for r, g in roles.items()}
    assert used == {"actor": [0, 1], "ref": [2], "reward": [None], "rollout": [3]}
    reward = roles["reward"].placement_report()[0]
    assert reward["placement_group_id"] is None and reward["as_planned"]
    assert reward["assigned_resources"] == {"CPU": 1.0}   # placement.role_cpus' default for a reward worker
    assert ray.get(roles["reward"].call("env"))[0]["WORLD_SIZE"] == "1"


@pytest.mark.slow
def test_unsatisfiable_requests_fail_clearly_without_hanging(local_ray, groups):
    big = plan_placement(replace(SEPARATE, gpus_per_node=8), {"actor": 5})
    with pytest.raises(PlacementError, match=r"needs 5 bundle\(s\).*GPU=4 in total"):
        create_placement_group(big, timeout_s=30)
    # fits the cluster in total, but another group holds the GPUs: fail after the timeout
    groups["pg"] = create_placement_group(plan_placement(SEPARATE, {"actor": 3}))
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=r"not ready after 1 s.*GPU=1 free"):
        create_placement_group(plan_placement(SEPARATE, {"actor": 2}), timeout_s=1)
    assert time.monotonic() - t0 < 10
    # the group that timed out was removed, not left pending
    states = {t["state"] for t in ray.util.placement_group_table().values()}
    assert "PENDING" not in states and "REMOVED" in states


def feeder_classes():
    from asr_grpo.distributed.role_group import RoleBase
    from asr_grpo.rollout.types import SequenceResult

    class Feeder(RoleBase):
        """A long call that sends items one by one through a reward feed, without waiting."""

        def work(self, n, sink):
            for i in range(n):
                time.sleep(0.05)
                sink.send([SequenceResult(f"u{i}", "g", [i], [0.0], [0], "stop")])
            self.sent = sink.take_sent()
            return time.time()

        def take_fed(self):
            return self.sent

    class Scorer(RoleBase):
        """Stands for a reward worker: records when each send arrived."""

        def score_finished(self, seqs, utterances):
            return {"uids": [s.uid for s in seqs], "at": time.time(), "label": utterances[0]["text"]}
    return Feeder, Scorer


def length_scorer_cls():
    from asr_grpo.distributed.role_group import RoleBase

    class LengthScorer(RoleBase):
        """A reward worker whose reward is a sequence's token count, after a short wait."""

        def score_finished(self, seqs, utterances):
            import torch

            from asr_grpo.rewards.combine import RewardResult
            time.sleep(0.2)
            return {**RewardResult(torch.tensor([float(len(s.tokens)) for s in seqs])).to_dict(), "hung_calls": 0}
    return LengthScorer


@pytest.mark.slow
def test_a_long_call_sends_to_the_reward_workers_while_it_runs(local_ray, groups):
    from types import SimpleNamespace

    from asr_grpo.distributed.reward_feed import RewardFeed
    from asr_grpo.distributed.role_group import RoleGroup
    from asr_grpo.rollout.feed import FeedSink
    feeder_cls, scorer_cls = feeder_classes()
    plan = plan_placement(COLOCATE, {"actor": 1, "reward": 1})
    groups["pg"] = create_placement_group(plan, timeout_s=120)
    feeder = RoleGroup("actor", feeder_cls, plan, groups["pg"], timeout_s=120)
    scorer = RoleGroup("reward", scorer_cls, plan, groups["pg"], timeout_s=120)
    groups["groups"] += [feeder, scorer]
    feeder.wait_ready()
    scorer.wait_ready()
    utt = {"text": "ref", "language": "en", "keywords": ["ref"], "duration": 1.0}
    sink = FeedSink(RewardFeed(scorer.handles), every_s=0.0).for_groups({"g": SimpleNamespace(utterance=utt)})
    ended = ray.get(feeder.call("work", 20, sink))[0]
    fed = ray.get(feeder.call("take_fed"))[0]
    assert [uids for _, uids in fed] == [[f"u{i}"] for i in range(20)]   # each item once, in order
    answers = [ray.get(ref) for (rank, ref), _ in fed]                   # the driver collects the host's calls
    assert [a["uids"] for a in answers] == [[f"u{i}"] for i in range(20)]
    assert {rank for (rank, _), _ in fed} == {0} and {a["label"] for a in answers} == {"ref"}
    assert sum(a["at"] < ended for a in answers) >= 10   # they arrived while the call ran


def _wait_until_dead(handle, timeout_s=30.0):
    """ray.kill is asynchronous: a call sent right after it may still be served, so ask until one fails."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(handle.take_fed.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    pytest.fail(f"the killed actor still answered after {timeout_s:.0f} s")


@pytest.mark.slow
def test_a_fed_call_lost_with_its_host_is_left_to_be_scored_again(local_ray, groups):
    from types import SimpleNamespace

    from asr_grpo.distributed.reward_feed import RewardFeed
    from asr_grpo.distributed.role_group import RoleGroup
    from asr_grpo.experience.maker import ExperienceMaker
    from asr_grpo.rollout.feed import FeedSink
    from asr_grpo.rollout.types import SequenceResult
    plan = plan_placement(COLOCATE, {"actor": 1, "reward": 1})
    groups["pg"] = create_placement_group(plan, timeout_s=120)
    feeder = RoleGroup("actor", feeder_classes()[0], plan, groups["pg"], timeout_s=120)
    scorer = RoleGroup("reward", length_scorer_cls(), plan, groups["pg"], timeout_s=120)
    groups["groups"] += [feeder, scorer]
    feeder.wait_ready()
    scorer.wait_ready()
    utt = {"text": "ref", "language": "en", "keywords": [], "duration": 1.0}
    sink = FeedSink(RewardFeed(scorer.handles), every_s=0.0).for_groups({"g": SimpleNamespace(utterance=utt)})
    ray.get(feeder.call("work", 4, sink))
    maker = ExperienceMaker(None, None, None, None, None, SimpleNamespace(handles=scorer.handles))
    for call, uids in ray.get(feeder.call("take_fed"))[0]:
        maker.adopt_fed(call, uids)
    seqs = [SequenceResult(f"u{i}", "g", [i], [], [], "stop") for i in range(4)]
    kept = maker._take_early(seqs[:2])            # collected while the host that made the calls lives
    assert sorted(kept) == ["u0", "u1"] and [kept[u].total.tolist() for u in ("u0", "u1")] == [[1.0], [1.0]]
    ray.kill(feeder.handles[0], no_restart=True)  # the calls' owner goes, and their results with it
    _wait_until_dead(feeder.handles[0])
    assert maker._take_early(seqs[2:]) == {}      # lost: left to be scored with the rest, no error
    assert maker._early == {} and maker._early_calls == {}
