"""A role (actor, ref, critic, reward, rollout) as a group of Ray actors, one per rank.

Each rank is pinned to the bundle its PlacementPlan slot names, with that slot's GPU
fraction and CPUs (`placement.role_cpus`), and gets the torch.distributed environment in its process
env before `__init__` runs, so DeepSpeed can initialise inside the actor.

`placement_report()` reads back from Ray where each rank really landed; the bundle
index comes from the resources the raylet granted the worker, not from the plan.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Sequence

from .net import free_port
from .placement import PlacementPlan, Slot

DIST_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Placement-group resources are granted under names like "GPU_group_1_<pg id hex>".
_PG_RESOURCE = re.compile(r"^.+_group_(\d+)_([0-9a-f]+)$")
# libgomp reads these when torch loads, so they reach a rank only through its environment.
# Its default spin-wait lets a thread team hold the core a preempted partner needs: with other
# jobs on the box (Ray runs actors at nice 15) a 2-thread phase ran 6x slower than 1 thread.
# A short spin keeps the quiet-box speed (bench/results/cpu_2core_serial_step/thread_phases.json). The driver's own
# setting wins.
OMP_ENV = {"GOMP_SPINCOUNT": "10000"}


def where_am_i() -> dict:
    """Run inside a Ray actor: its node, placement group, bundle and resources."""
    import ray

    ctx = ray.get_runtime_context()
    bundle = None
    try:   # the raw grant keeps the bundle index that get_assigned_resources() strips
        for name in ctx.worker.core_worker.resource_ids():
            m = _PG_RESOURCE.match(name)
            if m:
                bundle = int(m.group(1))
                break
    except AttributeError:   # private API moved: report what the public one gives
        pass
    return {"node_id": ctx.get_node_id(), "placement_group_id": ctx.get_placement_group_id(),
            "bundle_index": bundle, "assigned_resources": ctx.get_assigned_resources(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in DIST_ENV_KEYS}}


class RoleBase:
    """Mixin for role classes: lets the driver (or a peer) ask a rank where it runs."""

    def placement_info(self) -> dict:
        return where_am_i()


def _ask_where(_self) -> dict:   # via __ray_call__, so any actor class can answer
    return where_am_i()


def _pid(_self) -> int:
    return os.getpid()


def _rendezvous(pg, slot: Slot) -> tuple[str, int]:
    """MASTER_ADDR/PORT for the role's process group: the node holding rank 0's bundle.
    A local start binds Ray to the loopback, so this is 127.0.0.1 there; a port must be
    free on that node, so it is found there by a zero-CPU task when it is not ours."""
    import ray
    from ray.util.placement_group import placement_group_table
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    if pg is None or slot.bundle_index is None:
        return ray.util.get_node_ip_address(), free_port()
    node = placement_group_table(pg)["bundles_to_node_id"][slot.bundle_index]
    if node == here:
        return ray.util.get_node_ip_address(), free_port()
    addr = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)
    task = ray.remote(num_cpus=0)(free_port).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
    return addr, ray.get(task.remote(), timeout=60)


class RoleGroup:
    """`plan.ranks(role)` Ray actors of `actor_cls`, one per rank.

    num_cpus is the slot's (`placement.role_cpus`): by default a model rank reserves no
    core, so a 2-core box can host many ranks (the OS shares the cores; torch threads are
    set per rank and phase), and a reward worker one. The GPU fraction does the placing.
    LOCAL_RANK is "0": Ray narrows each GPU actor's CUDA_VISIBLE_DEVICES to its bundle's
    GPU, so inside the actor that GPU is always device 0 (OpenRLHF does the same);
    torchrun's node-local rank would name a device the actor cannot see.
    `max_restarts` / `max_task_retries` are Ray's actor fault-tolerance options
    (see `faults.restart_options`).
    """

    def __init__(self, role: str, actor_cls, plan: PlacementPlan, pg, *,
                 init_args: Sequence = (), init_kwargs: Optional[dict] = None,
                 env_vars: Optional[dict] = None, runtime_env: Optional[dict] = None,
                 timeout_s: Optional[float] = None, max_restarts: int = 0, max_task_retries: int = 0):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.role, self.plan, self.pg, self.timeout_s = role, plan, pg, timeout_s
        self.restartable = max_restarts != 0
        self.slots = plan.ranks(role)
        if not self.slots:
            raise ValueError(f"role {role!r} has 0 ranks in the plan; nothing to start")
        if pg is None and any(s.bundle_index is not None for s in self.slots):
            raise ValueError(f"role {role!r} needs GPU bundles but no placement group was "
                             f"given (create_placement_group(plan))")
        remote_cls = actor_cls if isinstance(actor_cls, ray.actor.ActorClass) else ray.remote(actor_cls)
        self.master_addr, self.master_port = _rendezvous(pg, self.slots[0])
        base_env = (runtime_env or {}).get("env_vars", {})
        self._handles = []
        for slot in self.slots:
            env = {**{k: os.environ.get(k, v) for k, v in OMP_ENV.items()}, **base_env, **(env_vars or {}),
                   "RANK": str(slot.rank),
                   "WORLD_SIZE": str(len(self.slots)), "LOCAL_RANK": "0",
                   "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
            strategy = None if slot.bundle_index is None else PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=slot.bundle_index)
            self._handles.append(remote_cls.options(
                num_cpus=slot.num_cpus, num_gpus=slot.num_gpus, scheduling_strategy=strategy,
                runtime_env={**(runtime_env or {}), "env_vars": env},
                max_restarts=max_restarts, max_task_retries=max_task_retries,
            ).remote(*init_args, **(init_kwargs or {})))

    # -- calls ---------------------------------------------------------------------------
    @property
    def handles(self) -> list:
        return list(self._handles)

    @property
    def world_size(self) -> int:
        return len(self._handles)

    def call(self, method: str, *args, **kwargs) -> list:
        """`method(*args, **kwargs)` on every rank; one ObjectRef per rank."""
        return [getattr(h, method).remote(*args, **kwargs) for h in self._handles]

    def call_rank(self, rank: int, method: str, *args, **kwargs):
        return getattr(self._handles[rank], method).remote(*args, **kwargs)

    def call_split(self, method: str, per_rank_args: Sequence, **kwargs) -> list:
        """Rank i runs `method(per_rank_args[i], **kwargs)` (e.g. its shard of a batch)."""
        if len(per_rank_args) != len(self._handles):
            raise ValueError(f"{self.role}: {len(per_rank_args)} per-rank arguments for "
                             f"{len(self._handles)} ranks")
        return [getattr(h, method).remote(a, **kwargs)
                for h, a in zip(self._handles, per_rank_args)]

    def wait_ready(self, timeout_s: Optional[float] = None) -> None:
        """Block until every rank's `__init__` finished; raises its error if one failed."""
        import ray
        ray.get([h.__ray_ready__.remote() for h in self._handles],
                timeout=timeout_s if timeout_s is not None else self.timeout_s)

    def rank_of(self, actor_id) -> Optional[int]:
        """The rank whose actor has this id (e.g. a RayActorError's `actor_id`), or None."""
        wanted = actor_id.hex() if hasattr(actor_id, "hex") else str(actor_id)
        for rank, h in enumerate(self._handles):
            if h._actor_id.hex() == wanted:
                return rank
        return None

    def pids(self) -> list[int]:
        """Each rank's current process id (a restart changes it)."""
        import ray
        return ray.get([h.__ray_call__.remote(_pid) for h in self._handles], timeout=self.timeout_s)

    def kill(self) -> None:
        import ray
        for h in self._handles:
            ray.kill(h, no_restart=True)
        self._handles = []

    # -- where did the ranks land --------------------------------------------------------
    def placement_report(self) -> list[dict]:
        """Per rank, what Ray says: node, placement group and bundle the actor holds
        (asked of the actor itself), the node Ray put that bundle on
        (placement_group_table), and whether both agree with the plan."""
        import ray
        from ray.util.placement_group import placement_group_table

        seen = ray.get([h.__ray_call__.remote(_ask_where) for h in self._handles],
                       timeout=self.timeout_s)
        table = placement_group_table(self.pg) if self.pg is not None else {}
        bundle_nodes = table.get("bundles_to_node_id", {})
        report = []
        for slot, info in zip(self.slots, seen):
            bundle_node = bundle_nodes.get(info["bundle_index"])
            report.append({
                "role": self.role, "rank": slot.rank, **info,
                "planned_bundle_index": slot.bundle_index, "planned_gpus": slot.num_gpus,
                "bundle_node_id": bundle_node,
                "as_planned": info["bundle_index"] == slot.bundle_index
                and (slot.bundle_index is None or (
                    info["placement_group_id"] == table.get("placement_group_id")
                    and info["node_id"] == bundle_node)),
            })
        return report
