"""torch threads per phase of the step.

A step runs in phases, and what runs side by side differs per phase: the policy decodes
and evaluates alone ("solo"), trains beside the critic if there is one ("train"), and
scores beside the reference, critic and reward model ("shared"; streaming scorers run
beside the decode). Model roles reserve no cores by default (placement.role_cpus: num_cpus=0,
so Ray sets OMP_NUM_THREADS=1 in them): with trainer.num_threads=auto each call takes the
node's cores divided by the ranks running side by side in its phase (a role given N >= 1
CPUs runs N threads in every phase). A thread team is fragile
when other jobs share the cores unless OpenMP stops spin-waiting soon: libgomp reads
GOMP_SPINCOUNT / OMP_WAIT_POLICY at start-up only, so they must be in the actor's
environment (bench/results/cpu_2core_serial_step/thread_phases.json).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os

from asr_grpo.distributed.placement import role_counts
from asr_grpo.models.lora import reference_role_needed

PHASES = ("solo", "train", "shared")


def node_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by the Ray node's CPU count
    (which sees a container's CPU quota, or a node started with --num-cpus)."""
    cores = len(os.sched_getaffinity(0))
    cpus = _ray_node_cpus()
    return max(1, min(cores, cpus) if cpus >= 1 else cores)


def _ray_node_cpus() -> int:
    """The CPU resource of the Ray node this process runs on (0: not in Ray)."""
    import ray

    if not ray.is_initialized():
        return 0
    node = ray.get_runtime_context().get_node_id()
    return int(next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0))


def reserved_cpus() -> int:
    """CPUs Ray reserved for this actor (0: none, the model roles' default placement.role_cpus)."""
    import ray

    if not ray.is_initialized():
        return 0
    return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0))


def side_by_side(cfg, world_size: int) -> dict[str, int]:
    """Per phase, the model-role ranks that compute at once on one node (ranks spread
    evenly over placement.num_nodes; the roles are those rl.py starts for this config).
    The policy counts among the scorers: it scores old log-probs, or decodes beside the
    streaming scorers."""
    counts = role_counts(cfg.placement, use_critic=cfg.algorithm.use_critic,
                         use_ref=reference_role_needed(cfg),
                         use_reward_model=cfg.reward.smoothness_scorer == "lm")
    nodes = max(1, int(cfg.placement.num_nodes))
    here = {role: math.ceil(n / nodes) for role, n in counts.items()}
    return {"solo": math.ceil(world_size / nodes), "train": here["actor"] + here["critic"],
            "shared": here["actor"] + here["ref"] + here["critic"] + here["reward_model"]}


def phase_threads(cfg, world_size: int = 1, *, cores: int | None = None, reserved: int = 0,
                  on_gpu: bool = False) -> dict[str, int]:
    """torch threads per phase. An integer trainer.num_threads pins every phase; `auto`
    splits the node's cores among the ranks of each phase. Cores Ray reserved for the
    actor are its own in every phase. On a GPU the compute is not on these threads: every
    phase takes the scoring share, which never oversubscribes the host."""
    pinned = cfg.trainer.num_threads
    if pinned != "auto":
        if not isinstance(pinned, int) or isinstance(pinned, bool) or pinned < 1:
            raise ValueError(f"trainer.num_threads must be 'auto' or an integer >= 1, got {pinned!r}")
        return dict.fromkeys(PHASES, pinned)
    if reserved >= 1:
        return dict.fromkeys(PHASES, reserved)
    cores = node_cores() if cores is None else cores
    ranks = side_by_side(cfg, world_size)
    share = {p: max(1, cores // max(1, ranks[p])) for p in PHASES}
    return dict.fromkeys(PHASES, share["shared"]) if on_gpu else share


def phase(name: str):
    """Decorator: run a role method with `self.threads(name)` (objects without thread
    control, such as the forecast's simulated hosts, run as they are)."""
    if name not in PHASES:
        raise ValueError(f"unknown thread phase {name!r}; phases: {PHASES}")

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            threads = getattr(self, "threads", None)
            with threads(name) if threads is not None else contextlib.nullcontext():
                return method(self, *args, **kwargs)
        run.thread_phase = name   # kept by outer functools.wraps (busy): tests read it
        return run
    return wrap
