"""Named extension points. A registry maps the value of one config key (say
`overlap.controller=cost_model`) to the code it selects; the code registers itself
under that name where it is defined, and the config validation checks the value
against the names registered.

The registries themselves live beside their extension point (the advantage
estimators in `algorithms/advantages.py`, the planners in `overlap/planners.py`, ...),
so the built-ins are registered whenever the registry is importable. A registry
announces itself here when its module loads: validation (in this, the lowest layer)
checks every registry loaded so far without importing the layers above it. The RL
recipe has loaded them all when it validates, before Ray starts.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from asr_grpo.config.errors import ConfigError

T = TypeVar("T")

_LOADED: dict[str, "Registry"] = {}   # config key -> its registry, in load order


class Registry(Generic[T]):
    """Names -> entries for the config key `key` (e.g. "rollout.engine")."""

    def __init__(self, key: str):
        self.key = key
        self._entries: dict[str, T] = {}
        _LOADED[key] = self

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` on a class or function registers it
        as is and leaves it unchanged. A name is registered once."""
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.key}: {name!r} is registered already")
            self._entries[name] = entry
            return entry
        return add

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's own example, after the test)."""
        del self._entries[name]

    def get(self, name: str) -> T:
        """The entry of `name`, or a ConfigError listing the registered names."""
        if name not in self._entries:
            raise ConfigError(self.unknown(name))
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """In the order registered."""
        return tuple(self._entries)

    def unknown(self, name: str) -> str:
        """The one-line message for a name nobody registered."""
        return f"{self.key}={name}: expected one of {', '.join(self.names())}"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())


def loaded_registries() -> dict[str, Registry]:
    """Config key -> registry, for every registry whose module has been imported."""
    return dict(_LOADED)
