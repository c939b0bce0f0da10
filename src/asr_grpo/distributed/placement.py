"""Placement planning: which placement-group bundle and which GPU fraction each role rank gets.

`plan_placement` is pure (no Ray), so a bad layout fails at config time, naming the
`placement.*` keys, before any cluster is started. `create_placement_group` turns a
plan into a Ray placement group and waits for it with a timeout, never hanging.

Both modes use ONE placement group of 1-GPU bundles. A placement group is reserved
atomically, so one group either holds everything the run needs or nothing: there is no
half-reserved state in which the actor's group holds GPUs while the critic's waits
forever, and there is one wait, one error and one cleanup. In separate mode the roles
simply get disjoint bundle ranges of that group.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional

from asr_grpo.config.schema import DEFAULT_ROLE_CPUS  # CPUs per rank of each role, and why

log = logging.getLogger(__name__)

# Order matters: separate mode hands out bundle ranges in this order.
ROLES = ("actor", "ref", "critic", "reward_model", "reward", "rollout")
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_EPS = 1e-9


@dataclass(frozen=True)
class Slot:
    """Where one rank of one role runs."""
    role: str
    rank: int
    bundle_index: Optional[int]   # None: CPU-only, scheduled outside the placement group
    num_gpus: float
    num_cpus: float = 0.0         # Ray CPUs reserved for the rank (in its bundle, when it has one)


@dataclass(frozen=True)
class PlacementPlan:
    colocate: bool
    bundles: tuple[dict, ...]            # resource dicts of the single placement group
    slots: Mapping[str, tuple[Slot, ...]]  # role -> one Slot per rank (empty if 0 ranks)
    strategy: str = "PACK"
    warnings: tuple[str, ...] = ()

    def ranks(self, role: str) -> tuple[Slot, ...]:
        if role not in self.slots:
            raise KeyError(f"role {role!r} is not in this plan (roles: {sorted(self.slots)})")
        return self.slots[role]

    def on_bundle(self, index: int) -> list[Slot]:
        return [s for slots in self.slots.values() for s in slots if s.bundle_index == index]

    def describe(self) -> str:
        mode = "colocate" if self.colocate else "separate"
        lines = [f"{mode}: {len(self.bundles)} bundle(s), strategy {self.strategy}"]
        for i, bundle in enumerate(self.bundles):
            cpus = f" ({bundle['CPU']:g} CPU)" if bundle.get("CPU") else ""
            lines.append(f"  bundle {i}{cpus}: " + ", ".join(
                f"{s.role}[{s.rank}]={s.num_gpus:g}" for s in self.on_bundle(i)))
        cpu_only = [f"{s.role}[{s.rank}]" + (f" ({s.num_cpus:g} CPU)" if s.num_cpus else "")
                    for ss in self.slots.values() for s in ss if s.bundle_index is None]
        if cpu_only:
            lines.append("  CPU-only: " + ", ".join(cpu_only))
        return "\n".join(lines)


def role_counts(placement_cfg, *, use_critic: bool, use_ref: bool = True,
                use_reward_model: bool = False) -> dict[str, int]:
    """Ranks per role from the config: ref and critic mirror the actor's data-parallel ranks
    (rank i of each consumes rank i's micro-batches), as in OpenRLHF. So does the
    reward model (the text LM scoring fluency) when the reward uses one."""
    n = int(placement_cfg.actor_num_ranks)
    return {"actor": n, "ref": n if use_ref else 0, "critic": n if use_critic else 0,
            "reward_model": n if use_reward_model else 0,
            "reward": int(placement_cfg.reward_num_workers),
            "rollout": int(placement_cfg.rollout_num_workers)}


def _gpu_fraction(placement_cfg, role: str) -> float:
    # Reward workers run a Python reward function (CER, keywords...): in colocate mode
    # they stay CPU-only, since any share they took would crowd the actor/ref bundle.
    # In separate mode they get `reward_gpus` of their own bundle, and 0 means CPU-only.
    # Any other role with a fraction of 0 is CPU-only too.
    if role == "reward" and placement_cfg.colocate:
        return 0.0
    return float(getattr(placement_cfg, f"{role}_gpus"))


def role_cpus(placement_cfg) -> dict[str, float]:
    """CPUs per rank of each role: `placement.role_cpus` over DEFAULT_ROLE_CPUS (a role it
    does not name keeps its default); unknown roles and negative counts name the key."""
    given = getattr(placement_cfg, "role_cpus", None)
    given = dict(given.items()) if given is not None else {}
    unknown = sorted(set(given) - set(ROLES))
    if unknown:
        raise ValueError(f"placement.role_cpus names unknown role(s) {unknown}; known roles: {list(ROLES)}")
    out = {**DEFAULT_ROLE_CPUS, **{r: float(v) for r, v in given.items()}}
    bad = {r: v for r, v in out.items() if not v >= 0.0 or v == float("inf")}
    if bad:
        raise ValueError(f"placement.role_cpus must be finite CPU counts >= 0, got {bad}")
    return out


def plan_placement(placement_cfg, roles: Mapping[str, int], *, strategy: str = "PACK") -> PlacementPlan:
    """Decide bundles and each rank's (bundle index, GPU fraction, CPUs).

    colocate: one bundle per rank index, i.e. max(ranks of the GPU roles) bundles; rank i
        of every GPU role sits on bundle i (actor i with ref i: 0.75 + 0.25).
    separate: every GPU rank gets a bundle of its own, roles in disjoint ranges.
    A bundle reserves the CPUs (`placement.role_cpus`) of the ranks it carries, and none
    when they reserve none; a CPU-only rank takes its CPUs from its node, outside the group.
    """
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown role(s) {unknown}; known roles: {list(ROLES)}")
    if strategy not in STRATEGIES:
        raise ValueError(f"placement strategy {strategy!r} is not one of {STRATEGIES}")
    counts = {r: int(roles.get(r, 0)) for r in ROLES}
    for role, n in counts.items():
        if n < 0:
            raise ValueError(f"role {role!r} has a negative rank count ({n})")

    frac = {r: _gpu_fraction(placement_cfg, r) for r in ROLES if counts[r]}
    for role, f in frac.items():
        if not 0.0 <= f <= 1.0:
            raise ValueError(
                f"placement.{role}_gpus={f:g} is outside [0, 1]: a rank gets at most one "
                f"1-GPU bundle")
    gpu_roles = [r for r in ROLES if counts[r] and frac[r] > 0]
    cpus = role_cpus(placement_cfg)

    # First bundle of each role: colocated roles all start at 0 (rank i on bundle i);
    # separate ones get consecutive, disjoint ranges.
    first, offset = {}, 0
    for role in gpu_roles:
        first[role] = 0 if placement_cfg.colocate else offset
        offset = max(offset, counts[role]) if placement_cfg.colocate else offset + counts[role]
    num_bundles = offset
    slots = {role: tuple(Slot(role, i, first[role] + i, frac[role], cpus[role]) if role in first
                         else Slot(role, i, None, 0.0, cpus[role]) for i in range(counts[role]))
             for role in ROLES}
    parts = ", ".join(f"{r} {counts[r]}" for r in gpu_roles)
    need = (f"colocated: max({parts}) = {num_bundles}" if placement_cfg.colocate
            else "separate: " + parts.replace(", ", " + "))

    capacity = int(placement_cfg.num_nodes) * int(placement_cfg.gpus_per_node)
    if num_bundles > capacity:
        raise ValueError(
            f"placement needs {num_bundles} GPU bundle(s) ({need}) but placement.num_nodes"
            f" * placement.gpus_per_node = {placement_cfg.num_nodes} * "
            f"{placement_cfg.gpus_per_node} = {capacity}; lower the rank counts or raise "
            f"gpus_per_node/num_nodes")

    def bundle(i: int) -> dict:
        cpu = sum(s.num_cpus for ss in slots.values() for s in ss if s.bundle_index == i)
        return {"GPU": 1.0, **({"CPU": cpu} if cpu > 0 else {})}

    plan = PlacementPlan(colocate=bool(placement_cfg.colocate),
                         bundles=tuple(bundle(i) for i in range(num_bundles)),
                         slots=slots, strategy=strategy,
                         warnings=_colocation_warnings(placement_cfg, counts, frac, gpu_roles))
    _check_bundle_loads(plan)
    for w in plan.warnings:
        log.warning(w)
    return plan


def _check_bundle_loads(plan: PlacementPlan) -> None:
    """Fractions sharing one bundle must fit in its one GPU, or Ray would leave the last
    rank pending forever; say which keys add up to what."""
    for i in range(len(plan.bundles)):
        on = plan.on_bundle(i)
        total = sum(s.num_gpus for s in on)
        if total > 1.0 + _EPS:
            terms = " + ".join(f"placement.{s.role}_gpus={s.num_gpus:g}" for s in on)
            raise ValueError(
                f"bundle {i} would carry {terms} = {total:g} > 1 GPU; colocated fractions "
                f"on one bundle must sum to at most 1: lower them, give a role fewer "
                f"ranks, or use placement=separate")


# Why 0.75/0.25 and not 0.5/0.5 for actor/ref: a GPU fraction is a scheduling token, not
# a memory share (both models use the GPU as they please). What the token controls is
# which ranks MAY share a bundle. With 0.5, two *actor* ranks fit on one bundle, so a
# scheduler free to pick bundles can put actor ranks 0 and 1 on bundle 0 before any
# reference rank arrives, and then actor i and ref i no longer share a GPU (and a bundle
# sits idle). With 0.75 a second actor rank cannot fit next to the first, so the actor
# ranks spread one per bundle and exactly 0.25 is left for the reference partner. We also
# pin every rank to its bundle index, which makes placement deterministic; the fractions
# remain the guard that turns a pinning mistake into a visible pending/failed actor
# instead of silent stacking.
def _colocation_warnings(placement_cfg, counts, frac, gpu_roles) -> tuple[str, ...]:
    if not placement_cfg.colocate:
        return ()
    return tuple(
        f"placement.{r}_gpus={frac[r]:g} <= 0.5: two {r} ranks fit on one bundle, so a "
        f"scheduler free to choose bundles could stack {r} ranks 0 and 1 on bundle 0 and "
        f"leave no room for their colocated partners (OpenRLHF's 0.75/0.25 rule). It works "
        f"here only because every rank is pinned to its bundle index; prefer > 0.5 for the "
        f"role that owns the bundle."
        for r in gpu_roles if counts[r] > 1 and frac[r] <= 0.5
        and frac[r] == max(frac[g] for g in gpu_roles))


def create_placement_group(plan: PlacementPlan, *, timeout_s: float = 60.0, name: str = ""):
    """Reserve the plan's bundles; return the PlacementGroup (None if the plan has no GPU
    ranks). Fails fast when the cluster cannot ever hold the bundles, and after
    `timeout_s` when it could but other work holds the resources, instead of hanging."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if not plan.bundles:
        return None
    keys = sorted({k for b in plan.bundles for k in b}, key=lambda k: (k != "GPU", k))
    need = {k: sum(b.get(k, 0.0) for b in plan.bundles) for k in keys}
    total = ray.cluster_resources()
    short = {k: v for k, v in need.items() if total.get(k, 0.0) + _EPS < v}
    if short:
        raise PlacementError(
            f"the plan needs {len(plan.bundles)} bundle(s) of 1 GPU "
            f"({_fmt(need)} in all), the cluster has {_fmt({k: total.get(k, 0.0) for k in need})}"
            f" in total; plan:\n{plan.describe()}")
    pg = placement_group([dict(b) for b in plan.bundles], strategy=plan.strategy, name=name)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementError(
            f"placement group of {len(plan.bundles)} bundle(s) of 1 GPU ({_fmt(need)} in all) not ready "
            f"after {timeout_s:g} s: the cluster has {_fmt(total)} in total but only "
            f"{_fmt({k: ray.available_resources().get(k, 0.0) for k in need})} free "
            f"(other placement groups or actors hold the rest)") from None
    return pg


class PlacementError(RuntimeError):
    """The cluster cannot provide what a PlacementPlan asks for."""


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in res.items() if k in ("GPU", "CPU")) or "none"
