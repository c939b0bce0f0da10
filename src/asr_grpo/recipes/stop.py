"""SIGTERM and SIGINT on the driver: stop at a step boundary, within a grace period.

A cluster preempts a job with SIGTERM and, a grace period later, SIGKILL (Slurm's
KillWait, Kubernetes' terminationGracePeriodSeconds: 30 s by default); a user stops a run
with Ctrl-C. Either way the run should keep what it trained. `StopSignals` turns the
first signal into a request, and what happens next depends on where the run is:

- `immediate()` (setup, the SFT warm start, the first evaluation; no step to keep): the
  run stops at once;
- `grace(s)` (a step in flight): the step may finish; if it has not `s` seconds after the
  signal, or a second signal comes, it is abandoned (its partial work is not saved);
- `deferred()` (between steps, while a checkpoint is written): only noted; the loop ends
  at its next step boundary, after writing the checkpoint.

The stop travels as `RunStopped`, a KeyboardInterrupt, so no `except Exception` on its
way (a sweep job's, Hydra's) takes it for an error of the run.

Ray's `ray.init` replaces the driver's SIGTERM handler with its own (an exit that ends in
an abort and a C++ stack dump); `distributed.ray_cluster.start_ray` puts ours back.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator, Optional

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
IMMEDIATE, GRACE, DEFERRED = "immediate", "grace", "deferred"


class RunStopped(KeyboardInterrupt):
    """The run was stopped by a signal; `str()` says at which step and what was kept. A
    KeyboardInterrupt: the one exception Ray's `ray.get` lets a signal handler raise
    through its wait (it swallows others, and raises a KeyboardInterrupt of its own, which
    the step's end turns back into this)."""

    def __init__(self, signum: int, detail: str):
        super().__init__(f"stopped by {signal.Signals(signum).name}: {detail}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum   # what a shell reports for a process the signal ended: 143, 130


class StopSignals:
    """The process's SIGTERM and SIGINT handler (see the module docstring); one per process,
    `install()`ed by the entry point. Not installed, it never sees a signal: a recipe run
    from Python keeps the caller's handlers."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None   # the first signal received
        self.mode = DEFERRED
        self._grace_s = 0.0
        self._timer: Optional[threading.Timer] = None
        self._grace_over = False
        self._raised: Optional[RunStopped] = None   # what the handler raised

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> "StopSignals":
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def stopped(self, detail: str) -> RunStopped:
        return RunStopped(self.signum or signal.SIGTERM, detail)

    def _stop(self, detail: str) -> RunStopped:
        """The stop the handler raises, kept: Ray's wait replaces it with a KeyboardInterrupt."""
        self._raised = self.stopped(detail)
        return self._raised

    # ---- where the run is ------------------------------------------------------------
    @contextlib.contextmanager
    def _mode(self, mode: str) -> Iterator[None]:
        saved, self.mode = self.mode, mode
        try:
            yield
        except BaseException as exc:
            stopped = stop_behind(exc) or (self._raised if isinstance(exc, KeyboardInterrupt) else None)
            if stopped is None or stopped is exc:
                raise
            raise stopped from None
        finally:
            self.mode = saved
            if mode == GRACE:
                self._cancel_timer()

    @contextlib.contextmanager
    def immediate(self) -> Iterator[None]:
        if self.requested:
            raise self.stopped("before the run started")
        with self._mode(IMMEDIATE):
            yield

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        with self._mode(DEFERRED):
            yield

    @contextlib.contextmanager
    def grace(self, grace_s: float) -> Iterator[None]:
        """The step in flight: a signal lets it finish for `grace_s` seconds."""
        self._grace_s = grace_s
        with self._mode(GRACE):
            if self.requested:   # a signal came just as the last step ended: the grace starts now
                self._start_timer()
            yield

    # ---- the handler -------------------------------------------------------------------
    def _on_signal(self, signum: int, frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        name = signal.Signals(signum).name
        if self.mode == IMMEDIATE:
            raise self._stop("before a step of this run finished")
        if self.mode == GRACE:
            if self._grace_over:
                raise self._stop(f"the step in flight was abandoned: not finished {self._grace_s:g} s after "
                                 "the signal (trainer.stop_grace_s)")
            if not first:
                raise self._stop(f"a second {name} abandoned the step in flight")
            log.warning("%s: finishing the step in flight (at most %g s, trainer.stop_grace_s), then checkpoint "
                        "and stop; a second signal stops at once", name, self._grace_s)
            self._start_timer()
        else:
            log.warning("%s: %s", name, "stopping at the end of this step" if first else "already stopping")

    def _start_timer(self) -> None:
        if self._timer is not None:
            return
        if self._grace_s <= 0:
            self._grace_over = True
            raise self._stop("the step in flight was abandoned (trainer.stop_grace_s=0)")
        self._timer = threading.Timer(self._grace_s, self._end_grace)
        self._timer.daemon = True
        self._timer.start()

    def _end_grace(self) -> None:
        """In the timer's thread: the signal again, to the main thread, whose handler then
        abandons the step (a real signal also cuts short a sleep or a blocking wait)."""
        if self.mode == GRACE:
            self._grace_over = True
            signal.pthread_kill(threading.main_thread().ident, self.signum)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def stop_behind(exc: BaseException) -> RunStopped | None:
    """The RunStopped that `exc` is, or wraps: raised while C code called back into Python
    (Ray's object deserialization does), it comes out as the `__cause__` of a SystemError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, RunStopped):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


_process = StopSignals()


def stop_signals() -> StopSignals:
    """This process's one `StopSignals` (installed or not)."""
    return _process
