"""overlap=none: the plain serial rollout every speedup is measured against. Groups are
spread over the rollout hosts (policy ranks when colocated, rollout workers when
separate), each host decodes its sequences to the end in one batched call."""
from __future__ import annotations

from collections import defaultdict

import ray

from asr_grpo.experience.types import PromptGroup
from asr_grpo.rollout.types import SequenceResult


def assign_groups(groups: list[PromptGroup], num_hosts: int) -> list[list[PromptGroup]]:
    """Round-robin by group: a group's n samples stay on one host (one audio encode)."""
    shards: list[list[PromptGroup]] = [[] for _ in range(num_hosts)]
    for i, g in enumerate(groups):
        shards[i % num_hosts].append(g)
    return shards


def collect_by_group(results: list[SequenceResult]) -> dict[str, list[SequenceResult]]:
    by_group: dict[str, list[SequenceResult]] = defaultdict(list)
    for r in results:
        by_group[r.group].append(r)
    for seqs in by_group.values():
        seqs.sort(key=lambda r: int(r.uid.rsplit("#", 1)[1]))
    return dict(by_group)


class SerialRollout:
    def __init__(self, hosts):
        self.hosts = hosts   # a RoleGroup exposing the RolloutHost methods

    def run(self, groups: list[PromptGroup]) -> dict[str, list[SequenceResult]]:
        shards = assign_groups(groups, self.hosts.world_size)
        ray.get(self.hosts.call_split("add_requests", [[r for g in s for r in g.requests()] for s in shards]))
        results = [r for rs in ray.get(self.hosts.call("decode", None)) for r in rs]
        return collect_by_group(results)
