"""Speedups (baseline step time / mode step time) with a 95% bootstrap interval, so that
run-to-run noise (identical serial work has measured 0.96x-1.13x apart) does not read
as a gain.

The point estimate is a ratio of medians: a run's figure is the median of its steps
(or their mean, for a throughput column), a side's figure the median of its runs'
figures. Medians because one slow step (an evaluation, a checkpoint, a GC pause) or one
slow run should not set the figure, and because the median step is what every table
headlines, so the interval brackets the number printed beside it. The bootstrap
recomputes that same statistic on every resample.

Two levels: runs (repeats, seeds) are resampled, then the steps within each chosen run.
Unpaired, the two sides are resampled independently. Paired (same seed, identical
work: a serial-planned mode, or the report's same-seed baseline), run pair j is drawn
as a unit and the same step indices are drawn for both of its runs, so a component
the two share (step i's response lengths) cancels in the ratio instead of widening it
(less than it would in a ratio of means: the median over runs may take its two sides
from different pairs).
Resampling both levels counts within-run noise twice over (it is in the run figures
too), which errs towards a wider interval. With per-run figures only ("runs only") the
runs alone are resampled. Seeded: the same input gives the same interval.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Optional, Sequence, Union

import numpy as np

LEVEL = 0.95
N_BOOT = 2000
STATISTICS = {"median": np.median, "mean": np.mean}


@dataclass(frozen=True)
class SpeedupCI:
    point: float        # median(baseline figures) / median(mode figures)
    low: float          # NaN when no interval can be drawn (per-run figures of one run)
    high: float
    n_runs: int         # runs per side (pairs when paired; the fewer side otherwise)
    n_steps: int        # steps per side, all runs together (the fewer side); 0: per-run figures only
    method: str         # "paired" | "unpaired"
    verdict: str        # "faster" | "slower" | "no difference" | "no interval"
    level: float = LEVEL

    @property
    def runs_only(self) -> bool:
        return self.n_steps == 0

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no interval"
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    return "no difference"


def _clean(runs: Sequence[Sequence[float]]) -> Optional[list[np.ndarray]]:
    """The runs as float arrays; None when a run is empty or holds a time that is not a
    positive finite number (a target never reached, 0 s: no ratio to speak of)."""
    out = [np.asarray(r, dtype=float).ravel() for r in runs]
    if not out or any(a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0) for a in out):
        return None
    return out


def _figures(runs: list[np.ndarray], pick: np.ndarray, rng: np.random.Generator, stat,
             partner: Optional[list[np.ndarray]] = None) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Per bootstrap draw and slot, the statistic of a step resample of run pick[b, k];
    with `partner`, the same step indices applied to the partner run (the pair's other side)."""
    own = np.empty(pick.shape)
    other = np.empty(pick.shape) if partner is not None else None
    for j, run in enumerate(runs):
        where = pick == j
        count = int(where.sum())
        if not count:
            continue
        steps = rng.integers(0, run.size, size=(count, run.size))
        own[where] = stat(run[steps], axis=1)
        if partner is not None:
            other[where] = stat(partner[j][steps], axis=1)
    return own, other


def _interval(baseline, mode, *, paired: bool, statistic: str, level: float, n_boot: int, seed: int,
              runs_only: bool) -> Optional[SpeedupCI]:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}: one of {sorted(STATISTICS)}")
    base, other = _clean(baseline), _clean(mode)
    if base is None or other is None:
        return None
    if paired:
        if len(base) != len(other):
            raise ValueError(f"paired runs: {len(base)} baseline runs against {len(other)} mode runs")
        cut = [min(b.size, m.size) for b, m in zip(base, other)]
        base, other = [b[:n] for b, n in zip(base, cut)], [m[:n] for m, n in zip(other, cut)]
    stat = STATISTICS[statistic]
    point = float(np.median([stat(r) for r in base]) / np.median([stat(r) for r in other]))
    n_runs = min(len(base), len(other))
    n_steps = 0 if runs_only else min(sum(r.size for r in base), sum(r.size for r in other))
    method = "paired" if paired else "unpaired"
    if runs_only and n_runs < 2:   # one figure a side: nothing to resample
        return SpeedupCI(point, math.nan, math.nan, n_runs, n_steps, method, "no interval", level)
    rng = np.random.default_rng(seed)
    if paired:
        pick = rng.integers(0, len(base), size=(n_boot, len(base)))
        fb, fm = _figures(base, pick, rng, stat, partner=other)
    else:
        fb, _ = _figures(base, rng.integers(0, len(base), size=(n_boot, len(base))), rng, stat)
        fm, _ = _figures(other, rng.integers(0, len(other), size=(n_boot, len(other))), rng, stat)
    ratios = np.median(fb, axis=1) / np.median(fm, axis=1)
    low, high = (float(q) for q in np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2]))
    return SpeedupCI(point, low, high, n_runs, n_steps, method, verdict(low, high), level)


def speedup_ci(baseline: Sequence[Sequence[float]], mode: Sequence[Sequence[float]], *, paired: bool = False,
               statistic: str = "median", level: float = LEVEL, n_boot: int = N_BOOT,
               seed: int = 0) -> Optional[SpeedupCI]:
    """The speedup baseline/mode of per-step times, one list per run on each side, with its
    two-level bootstrap interval. `paired`: run j of each side is one pair (same seed,
    identical work), step i of one paired with step i of the other (the longer run is cut
    to the shorter). `statistic`: a run's figure over its steps, "median" or "mean". None
    when a side is empty or holds a time that is not positive and finite."""
    return _interval(baseline, mode, paired=paired, statistic=statistic, level=level, n_boot=n_boot, seed=seed,
                     runs_only=False)


def run_speedup_ci(baseline: Sequence[float], mode: Sequence[float], *, paired: bool = False,
                   level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0) -> Optional[SpeedupCI]:
    """The speedup of per-run figures (a run's median step, its time to a target: one number
    a run), the runs alone resampled; `paired`: run j of each side is one pair. An interval
    needs two runs a side."""
    return _interval([[x] for x in baseline], [[x] for x in mode], paired=paired, statistic="median",
                     level=level, n_boot=n_boot, seed=seed, runs_only=True)


def format_speedup(ci: Union[SpeedupCI, Mapping, None], point: Optional[float] = None) -> str:
    """`1.42x [1.31, 1.55]`, `1.02x [0.95, 1.09] no difference`, with `(runs only, n=3)`
    when only per-run figures were resampled and `(1 run: steps only)` when run-to-run
    noise could not be; without an interval, `point` (when given) and why."""
    if ci is None:
        return "-" if point is None or not math.isfinite(point) else f"{point:.2f}x (no interval)"
    if isinstance(ci, Mapping):
        ci = SpeedupCI(**ci)
    if ci.verdict == "no interval":
        return f"{ci.point:.2f}x (no interval: {ci.n_runs} run{'s' if ci.n_runs != 1 else ''})"
    text = f"{ci.point:.2f}x [{ci.low:.2f}, {ci.high:.2f}]"
    if ci.verdict == "no difference":
        text += " no difference"
    if ci.runs_only:
        text += f" (runs only, n={ci.n_runs})"
    elif ci.n_runs == 1:
        text += " (1 run: steps only)"
    return text
