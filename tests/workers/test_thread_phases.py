"""torch threads follow the phase of the step (workers/threads.py): a rank computing alone takes
the node's cores, ranks computing side by side split them, an integer pins every phase."""
from __future__ import annotations

import pytest
import ray
from helpers import compose_cfg
from omegaconf import OmegaConf

from asr_grpo.config.schema import PlacementConfig
from asr_grpo.distributed.placement import create_placement_group, plan_placement
from asr_grpo.workers.threads import phase_threads


@pytest.fixture(scope="module")
def cfgs(tmp_path_factory):
    """Composed run configs (no corpus needed: nothing is built)."""
    root = tmp_path_factory.mktemp("threads")
    return {name: compose_cfg(root, *over) for name, over in {
        "grpo": [], "ppo": ["algorithm=ppo"], "lm": ["reward=asr_lm"], "pinned": ["trainer.num_threads=3"],
        "two_ranks": ["placement.actor_num_ranks=2"], "bad": ["trainer.num_threads=many"]}.items()}


# ---------------------------------------------------------------- the rule (fast) --
def test_default_is_auto(cfgs):
    assert cfgs["grpo"].trainer.num_threads == "auto"


def test_auto_gives_a_lone_rank_the_cores_and_splits_them_side_by_side(cfgs):
    # GRPO: the policy decodes and trains alone; it scores beside the reference.
    assert phase_threads(cfgs["grpo"], cores=8) == {"solo": 8, "train": 8, "shared": 4}
    # PPO: the critic trains beside the policy, and scores beside policy and reference.
    assert phase_threads(cfgs["ppo"], cores=8) == {"solo": 8, "train": 4, "shared": 2}
    # The LM reward model scores beside the policy and the reference.
    assert phase_threads(cfgs["lm"], cores=8) == {"solo": 8, "train": 8, "shared": 2}
    # Two policy ranks on the node: every phase halves.
    assert phase_threads(cfgs["two_ranks"], 2, cores=8) == {"solo": 4, "train": 4, "shared": 2}
    assert phase_threads(cfgs["grpo"], cores=1) == {"solo": 1, "train": 1, "shared": 1}


def test_an_integer_pins_every_phase_and_nonsense_is_refused(cfgs):
    assert phase_threads(cfgs["pinned"], cores=8) == {"solo": 3, "train": 3, "shared": 3}
    with pytest.raises(ValueError, match="trainer.num_threads must be 'auto' or an integer >= 1, got 'many'"):
        phase_threads(cfgs["bad"], cores=8)


def test_reserved_cpus_and_gpus_do_not_switch(cfgs):
    # Cores Ray reserved for the actor are its own; on a GPU the host never oversubscribes.
    assert phase_threads(cfgs["ppo"], cores=8, reserved=3) == {"solo": 3, "train": 3, "shared": 3}
    assert phase_threads(cfgs["grpo"], cores=8, on_gpu=True) == {"solo": 4, "train": 4, "shared": 4}


def test_the_roles_methods_carry_their_phase():
    from asr_grpo.workers.critic import CriticRole
    from asr_grpo.workers.policy import PolicyRole
    from asr_grpo.workers.reference import ReferenceRole
    from asr_grpo.workers.reward_model import RewardModelRole

    seen = {f"{cls.__name__}.{m}": getattr(getattr(cls, m), "thread_phase", None) for cls, m in [
        (PolicyRole, "train"), (PolicyRole, "transcribe"), (PolicyRole, "compute_logprobs"),
        (PolicyRole, "decode"),
        (ReferenceRole, "compute_logprobs"), (ReferenceRole, "stream"), (CriticRole, "compute_values"),
        (CriticRole, "train"), (CriticRole, "stream"), (RewardModelRole, "compute_fluency")]}
    expected = {"PolicyRole.train": "train", "PolicyRole.transcribe": "solo",
                "PolicyRole.compute_logprobs": "shared",
                "ReferenceRole.compute_logprobs": "shared", "ReferenceRole.stream": "shared",
                "CriticRole.compute_values": "shared", "CriticRole.train": "train",
                "CriticRole.stream": "shared",
                "RewardModelRole.compute_fluency": "shared"}
    assert seen.pop("PolicyRole.decode") == "solo"
    assert seen == expected


# ------------------------------------------------------ inside Ray actors (slow) --
@pytest.fixture(scope="module")
def local_ray():
    from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray
    yield start_ray(PlacementConfig(gpus_per_node=2), num_cpus=2, log_to_driver=False)
    shutdown_ray()


def probe_cls():
    # Defined in a function so cloudpickle ships it by value (the test module itself is
    # not importable by the Ray workers).
    import os

    import torch

    from asr_grpo.workers.base import ModelRole
    from asr_grpo.workers.threads import node_cores, phase

    class ThreadProbe(ModelRole):
        def seen(self) -> dict:
            return {"threads": torch.get_num_threads(), "cores": node_cores(),
                    "omp_env": os.environ.get("OMP_NUM_THREADS")}

        @phase("solo")
        def solo(self) -> dict:
            return self.seen()

        @phase("train")
        def train(self) -> dict:
            return self.seen()

        @phase("shared")
        def shared(self) -> dict:
            return self.seen()
    return ThreadProbe


def probe_threads(cfg) -> dict:
    """Start the policy and the reference as probes, as rl.py places them; ask the policy
    rank the threads it runs each phase with, and between calls."""
    from asr_grpo.distributed.role_group import RoleGroup

    plan = plan_placement(cfg.placement, {"actor": 1, "ref": 1})
    pg = create_placement_group(plan, timeout_s=120)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    groups = [RoleGroup(role, probe_cls(), plan, pg, init_kwargs={"cfg": cfg_dict}, timeout_s=120)
              for role in ("actor", "ref")]
    try:
        actor = groups[0]
        seen = {name: ray.get(actor.call(name))[0] for name in ("solo", "shared", "train")}
        seen["idle"] = ray.get(actor.call("seen"))[0]
        return seen
    finally:
        for g in groups:
            g.kill()
        ray.util.remove_placement_group(pg)


@pytest.mark.slow
def test_auto_threads_follow_the_phase_inside_a_ray_actor(local_ray, cfgs):
    seen = probe_threads(cfgs["grpo"])
    cores = seen["solo"]["cores"]
    if cores < 2:
        pytest.skip("one core: every phase has one thread")
    # Ray caps a num_cpus=0 actor at OMP_NUM_THREADS=1; the phase overrides it per call.
    assert seen["solo"]["omp_env"] == "1"
    assert seen["solo"]["threads"] == seen["train"]["threads"] == cores
    assert seen["shared"]["threads"] == cores // 2   # policy beside the reference
    assert seen["idle"]["threads"] == cores // 2     # put back after each call (the start-up share)


@pytest.mark.slow
def test_an_integer_pins_every_phase_inside_a_ray_actor(local_ray, cfgs):
    seen = probe_threads(cfgs["pinned"])
    assert {p: seen[p]["threads"] for p in ("solo", "train", "shared", "idle")} == dict.fromkeys(
        ("solo", "train", "shared", "idle"), 3)
