"""An in-process stand-in for a Ray `RoleGroup`: the same calls (`call`, `call_rank`,
`call_split`) on plain Python objects, results returned at once. With `resolve=
local_resolve` the scheduler drives such groups without Ray: the forecast runs the real
scheduler this way over simulated hosts and scorers on a virtual clock."""
from __future__ import annotations

from typing import Any, Sequence


def local_resolve(result: Any) -> Any:
    """What `ray.get` is to a RoleGroup's refs: here the results themselves."""
    return result


class LocalGroup:
    def __init__(self, members: Sequence[Any]):
        self.members = list(members)

    @property
    def world_size(self) -> int:
        return len(self.members)

    def call(self, method: str, *args, **kwargs) -> list:
        return [getattr(m, method)(*args, **kwargs) for m in self.members]

    def call_rank(self, rank: int, method: str, *args, **kwargs):
        return getattr(self.members[rank], method)(*args, **kwargs)

    def call_split(self, method: str, per_rank_args: Sequence, **kwargs) -> list:
        if len(per_rank_args) != len(self.members):
            raise ValueError(f"{len(per_rank_args)} per-rank arguments for {len(self.members)} members")
        return [getattr(m, method)(a, **kwargs) for m, a in zip(self.members, per_rank_args)]
