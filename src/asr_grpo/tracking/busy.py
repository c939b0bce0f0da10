"""Busy time per role: how long a Ray actor spent computing, read by the driver once a
step, so utilization (busy / step wall time) can be logged as perf/util/<role>."""
from __future__ import annotations

import functools
import time


def busy(method):
    """Count the wall time of an actor method as busy time."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy_s = getattr(self, "_busy_s", 0.0) + time.perf_counter() - t0
    return timed


class BusyClock:
    def take_busy_seconds(self) -> float:
        """Busy seconds since the last call."""
        spent, self._busy_s = getattr(self, "_busy_s", 0.0), 0.0
        return spent
