"""OPPO's two online controllers.

* `ChunkSizeController` picks the decode chunk size by timing each candidate for one
  step every P steps and keeping the fastest until the next trial round.
* `DeltaController` adapts the overcommit degree Δ to the slope of the mean reward
  over a sliding window (the OPPO paper's Algorithm 1, plus an additive variant).

Both are plain Python and carry their whole state in `state_dict()`, so a resumed run
makes exactly the decisions an uninterrupted one would have made.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

from asr_grpo.config.schema import DeltaRule

DELTA_RULES = tuple(r.value for r in DeltaRule)


def _as_int(name: str, value: Any) -> int:
    # bool is an int subclass, and 8.0 or "8" in a hand-edited config is a typo worth catching.
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name}={value!r}: must be an integer")
    return int(value)


class ChunkSizeController:
    """Chooses the decode chunk size online by periodic trials (the OPPO paper's rule).

    Steps count from 0; the first `warmup_steps` (model loading, first-call costs) are
    never trials. A trial round starts then and every `trial_period` steps after; in a
    round each candidate runs `steps_per_candidate` consecutive steps, and the candidate
    with the least *median* step time is used until the next round (one step is too
    noisy a measure: steps vary by 2x). Candidate 0 means "no streaming".
    """

    def __init__(self, *, chunk_size: int, candidates: Sequence[int], trial_period: int,
                 warmup_steps: int = 0, steps_per_candidate: int = 1):
        chunk_size = _as_int("chunk_size", chunk_size)
        trial_period = _as_int("trial_period", trial_period)
        warmup_steps = _as_int("chunk_trial_warmup", warmup_steps)
        steps_per_candidate = _as_int("chunk_trial_steps", steps_per_candidate)
        candidates = [_as_int("chunk_candidates[]", c) for c in candidates]
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size}: must be >= 1")
        if not candidates:
            raise ValueError("chunk_candidates is empty: need at least one chunk size")
        if min(candidates) < 0:
            raise ValueError(f"chunk_candidates={candidates}: every chunk size must be >= 0 (0: no streaming)")
        if len(set(candidates)) != len(candidates):
            raise ValueError(f"chunk_candidates={candidates}: contains duplicates")
        if trial_period < 0:
            raise ValueError(f"trial_period={trial_period}: must be >= 0 (0 disables trials)")
        if warmup_steps < 0 or steps_per_candidate < 1:
            raise ValueError(f"chunk_trial_warmup={warmup_steps} must be >= 0 and "
                             f"chunk_trial_steps={steps_per_candidate} >= 1")
        self.chunk_size = chunk_size
        self.candidates = candidates
        self.trial_period = trial_period
        self.warmup, self.per_candidate = warmup_steps, steps_per_candidate
        # P shorter than a round (n candidates x m steps): restarting at every multiple
        # of P would cut each round short, and no round could ever compare all
        # candidates. Trials take precedence: a round always runs to completion, and
        # rounds start every P * ceil(n*m / P) steps, the smallest multiple of P that
        # holds a whole round.
        n = len(candidates)
        self._length = n * steps_per_candidate
        self._period = -(-self._length // trial_period) * trial_period if trial_period else 0
        # One candidate: a trial could only pick it, so skip trials and use it outright.
        self._trials = trial_period > 0 and n > 1
        self._chosen = candidates[0] if n == 1 else chunk_size
        self._round: int | None = None       # round whose timings are being collected
        self._closed = -1                    # last round closed; later reports for it are dropped
        self._timings: dict[int, list[float]] = {}
        self._last_trial: dict[int, float] = {}

    @classmethod
    def from_config(cls, cfg: Any) -> ChunkSizeController:
        """From an `OverlapConfig` or a DictConfig with the same fields."""
        return cls(chunk_size=cfg.chunk_size, candidates=list(cfg.chunk_candidates),
                   trial_period=cfg.chunk_trial_period, warmup_steps=cfg.chunk_trial_warmup,
                   steps_per_candidate=cfg.chunk_trial_steps)

    @property
    def chosen(self) -> int:
        """The size used outside trial steps."""
        return self._chosen

    @property
    def last_trial(self) -> dict[int, float]:
        """Median seconds per candidate measured in the last completed round (for logging)."""
        return dict(self._last_trial)

    @property
    def period(self) -> int:
        """Steps between the starts of two trial rounds (0: no trials)."""
        return self._period if self._trials else 0

    def _position(self, step: int) -> tuple[int, int] | None:
        """(round, position in it) of a trial step; None outside trials."""
        if step < 0:
            raise ValueError(f"step={step}: must be >= 0")
        if not self._trials or step < self.warmup:
            return None
        rnd, pos = divmod(step - self.warmup, self._period)
        return (rnd, pos) if pos < self._length else None

    def in_trial(self, step: int) -> bool:
        return self._position(step) is not None

    def chunk_for_step(self, step: int) -> int:
        """The chunk size for `step`: a pure function of `step` and observed history."""
        at = self._position(step)
        if at is not None:
            return self.candidates[at[1] // self.per_candidate]
        return self._chosen

    def observe(self, step: int, chunk: int, seconds: float) -> None:
        """Record the measured latency of `step`, which ran with chunk size `chunk`.

        Only trial steps are recorded. Any observation past a round's trial steps closes
        that round with whatever it measured, so a lost measurement cannot stall choices.
        """
        if step < 0:
            raise ValueError(f"step={step}: must be >= 0")
        if not self._trials or step < self.warmup:
            return
        rnd, pos = divmod(step - self.warmup, self._period)
        trial = pos < self._length
        if self._round is not None and (rnd > self._round or (rnd == self._round and not trial)):
            self._close_round()
        if not trial or rnd <= self._closed or (self._round is not None and rnd < self._round):
            return  # not a trial step, or a late report from a round already over
        expected = self.candidates[pos // self.per_candidate]
        if chunk != expected:
            raise ValueError(f"step {step} is a trial step for chunk size {expected}, got chunk={chunk}")
        if not math.isfinite(seconds) or seconds < 0:
            return  # a broken timing says nothing about the candidate's speed
        self._round = rnd
        self._timings.setdefault(chunk, []).append(float(seconds))
        if pos == self._length - 1:
            self._close_round()

    def _close_round(self) -> None:
        if self._timings:
            medians = {c: statistics.median(t) for c, t in self._timings.items()}
            # Ties go to the earlier candidate, keeping the choice deterministic.
            self._chosen = min(self.candidates, key=lambda c: medians.get(c, math.inf))
            self._last_trial = medians
        self._closed = self._round
        self._round, self._timings = None, {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "chosen": self._chosen,
            "round": self._round,
            "closed": self._closed,
            # Pairs rather than int-keyed dicts: survives a JSON round trip unchanged.
            "timings": [[c, list(s)] for c, s in self._timings.items()],
            "last_trial": [[c, s] for c, s in self._last_trial.items()],
            "candidates": list(self.candidates),
            "trial_period": self.trial_period,
            "warmup": self.warmup, "per_candidate": self.per_candidate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._chosen = _as_int("chosen", state["chosen"])
        self._last_trial = {int(c): float(s) for c, s in state["last_trial"]}
        same_schedule = (list(state["candidates"]) == self.candidates
                         and state["trial_period"] == self.trial_period
                         and state.get("warmup", 0) == self.warmup
                         and state.get("per_candidate", 1) == self.per_candidate)
        if same_schedule:
            self._round = state["round"]
            self._closed = state["closed"]
            self._timings = {int(c): [float(x) for x in (s if isinstance(s, list) else [s])]
                             for c, s in state["timings"]}
        else:
            # The config changed on resume: round indices and a half-done round no longer
            # match the new schedule, so drop them; the next round starts clean.
            self._round, self._closed, self._timings = None, -1, {}


class DeltaController:
    """The overcommit degree Δ, steered by the slope of the mean reward.

    With R the last w+1 finite mean rewards, s_t = (R_t - R_{t-w}) / w. Once the window
    is full, a rising reward (s_t > 0) grows Δ and anything else shrinks it, within
    [delta_min, delta_max]. Step sizes: delta_inc / delta_dec ("additive") or
    max(1, floor(Δ/4)) both ways ("proportional", the OPPO paper's Algorithm 1).
    """

    def __init__(self, *, delta_init: int = 0, delta_min: int = 0, delta_max: int = 4,
                 delta_inc: int = 1, delta_dec: int = 1, window: int = 5, rule: str = "additive"):
        delta_init, delta_min, delta_max = (_as_int("delta_init", delta_init), _as_int("delta_min", delta_min),
                                            _as_int("delta_max", delta_max))
        delta_inc, delta_dec = _as_int("delta_inc", delta_inc), _as_int("delta_dec", delta_dec)
        window = _as_int("delta_window", window)
        if delta_min < 0:
            raise ValueError(f"delta_min={delta_min}: must be >= 0")
        if delta_min > delta_max:
            raise ValueError(f"delta_min={delta_min} > delta_max={delta_max}")
        if not delta_min <= delta_init <= delta_max:
            raise ValueError(f"delta_init={delta_init}: must lie in [delta_min={delta_min}, delta_max={delta_max}]")
        if delta_inc < 0 or delta_dec < 0:
            raise ValueError(f"delta_inc={delta_inc} / delta_dec={delta_dec}: must be >= 0")
        if window < 1:
            raise ValueError(f"delta_window={window}: must be >= 1")
        if rule not in DELTA_RULES:
            raise ValueError(f"delta_rule={rule!r}: must be one of {DELTA_RULES}")
        self.delta_min, self.delta_max = delta_min, delta_max
        self.delta_inc, self.delta_dec = delta_inc, delta_dec
        self.window, self.rule = window, rule
        self._delta = delta_init
        self._rewards: deque[float] = deque(maxlen=window + 1)

    @classmethod
    def from_config(cls, cfg: Any) -> DeltaController:
        """From an `OverlapConfig` or a DictConfig with the same fields."""
        return cls(delta_init=cfg.delta_init, delta_min=cfg.delta_min, delta_max=cfg.delta_max,
                   delta_inc=cfg.delta_inc, delta_dec=cfg.delta_dec, window=cfg.delta_window,
                   rule=cfg.delta_rule)

    @property
    def delta(self) -> int:
        return self._delta

    @property
    def slope(self) -> float | None:
        """s_t over the current window; None until w+1 rewards have been seen."""
        if len(self._rewards) <= self.window:
            return None
        return (self._rewards[-1] - self._rewards[0]) / self.window

    def observe(self, mean_reward: float) -> int:
        """Feed one step's mean reward; returns the new Δ."""
        reward = float(mean_reward)
        if not math.isfinite(reward):
            return self._delta  # one failed reward batch must not steer Δ
        self._rewards.append(reward)
        s = self.slope
        if s is None:
            return self._delta
        if self.rule == "proportional":
            inc = dec = max(1, self._delta // 4)
        else:
            inc, dec = self.delta_inc, self.delta_dec
        if s > 0:
            self._delta = min(self.delta_max, self._delta + inc)
        else:
            self._delta = max(self.delta_min, self._delta - dec)
        return self._delta

    def state_dict(self) -> dict[str, Any]:
        return {"delta": self._delta, "rewards": list(self._rewards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Clamp and trim so a resume with tightened bounds or a shorter window still
        # holds a valid state rather than failing.
        delta = _as_int("delta", state["delta"])
        self._delta = min(self.delta_max, max(self.delta_min, delta))
        self._rewards = deque((float(r) for r in state["rewards"]), maxlen=self.window + 1)
