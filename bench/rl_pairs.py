"""Each variant of an RL quality table against a baseline variant, seed by seed: the
difference of their relative CER drops on runs of the same seed from the same SFT
checkpoint, and whether the variant meets the adoption rule of docs/experiments.md
(ahead on the mean over at least three seeds, and no seed behind by more than the
baseline's spread over those seeds).

Runs from different checkpoints (another machine's `make run`, a rebuilt SFT) start from
different CERs; pairing a variant's run with the baseline's of the same seed *and the same
step-0 dev CER* compares like with like, so seeds run in different sessions still pair.
"""
from __future__ import annotations

from asr_grpo.tracking.runs import mean

SETS = ("dev", "ema/dev", "heldout_voices", "ema/heldout_voices")   # the policy, then its weight average
SEEDS_TO_ADOPT = 3


def start_point(row: dict) -> tuple:
    """What a run started from: its seed and its SFT checkpoint, known by the greedy dev
    CER at step 0 (deterministic for a checkpoint, different between checkpoints)."""
    return str(row.get("seed")), round(row["dev"]["start"], 6)


def pairs(groups: dict[str, list[dict]], base: str) -> dict[str, list[tuple[dict, dict]]]:
    """Each other variant's runs with the baseline's run of the same start point; runs
    without a partner are left out."""
    if base not in groups:
        raise SystemExit(f"rl_pairs: no variant {base!r} to pair with; the variants are {sorted(groups)}")
    base_at = {start_point(r): r for r in groups[base]}
    return {name: [(base_at[start_point(r)], r) for r in rows if start_point(r) in base_at]
            for name, rows in groups.items() if name != base}


def gain(base_row: dict, row: dict, name: str) -> float | None:
    """How many points more the variant's CER dropped (relative, in %) than the baseline's."""
    if name not in base_row or name not in row:
        return None
    return 100 * (row[name]["drop"] - base_row[name]["drop"])


def verdict(gains: list[float], base_drops: list[float]) -> str:
    """The adoption rule on one set's paired gains (points) and the baseline's drops (%)."""
    if len(gains) < SEEDS_TO_ADOPT:
        return f"{len(gains)} of {SEEDS_TO_ADOPT} seeds"
    if mean(gains) <= 0:
        return "not ahead"
    spread = max(base_drops) - min(base_drops)
    if min(gains) < -spread:
        return f"ahead on the mean, one seed behind by more than the spread ({spread:.1f})"
    return "adopt"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def paired_table(groups: dict[str, list[dict]], base: str, sets: tuple[str, ...] = SETS) -> str:
    """Markdown: a line per pair (the seed, the start dev CER, the gain on each set), then
    each variant's mean gain and the adoption rule's verdict on dev (the policy's)."""
    lines = ["| variant | seed | start dev CER | " + " | ".join(f"{s}: gain over {base} (points)" for s in sets) + " |",
             "|" + " --- |" * (len(sets) + 3)]
    for name, matched in pairs(groups, base).items():
        for base_row, row in matched:
            lines.append(f"| {name} | {row.get('seed')} | {100 * row['dev']['start']:.1f}% | "
                         + " | ".join(_cell(gain(base_row, row, s)) for s in sets) + " |")
        if not matched:   # shown, so a variant missing from the comparison is not missed
            lines.append(f"| {name}: no run of a seed and checkpoint {base} has | | | " + " | ".join("-" for _ in sets) + " |")
            continue
        means = []
        for s in sets:
            gains = [g for g in (gain(b, r, s) for b, r in matched) if g is not None]
            means.append(_cell(mean(gains)) if gains else "-")
        dev_gains = [gain(b, r, "dev") for b, r in matched]
        rule = verdict(dev_gains, [100 * b["dev"]["drop"] for b, _ in matched])
        seeds = f"{len(matched)} seed" + ("s" if len(matched) > 1 else "")
        lines.append(f"| {name}: mean of {seeds} ({rule}) | | | " + " | ".join(means) + " |")
    return "\n".join(lines)
