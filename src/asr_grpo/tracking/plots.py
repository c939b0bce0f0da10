"""PNG plots of a speedup report (`asr_grpo.tracking.report.build_report`): one colour per
configuration, one line style per seed. Drawn on `matplotlib.figure.Figure` objects, so
no display and no global pyplot state are involved."""
from __future__ import annotations

import textwrap
from pathlib import Path

from matplotlib.figure import Figure

LINESTYLES = ("-", "--", ":", "-.")


def _colors(report: dict) -> dict[str, str]:
    cmap = [f"C{i}" for i in range(10)]
    return {row["label"]: cmap[i % len(cmap)] for i, row in enumerate(report["rows"])}


def _style(report: dict, run: dict) -> dict:
    seeds = sorted({r["seed"] for r in report["runs"]})
    return {"color": _colors(report)[run["label"]], "linestyle": LINESTYLES[seeds.index(run["seed"]) % 4],
            "label": f"{run['label']} seed={run['seed']}"}


def _save(fig: Figure, path: Path, bottom: float = 0.0) -> Path:
    """Lay out the panels above `bottom` (a fraction of the figure kept for a legend) and write the PNG."""
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=110)
    return path


def curves(report: dict, path: Path) -> Path:
    """Training reward and held-out CER against wall-clock time and against step."""
    fig = Figure(figsize=(12, 8))
    axes = fig.subplots(2, 2)
    for run in report["runs"]:
        s, style = run["summary"], _style(report, run)
        axes[0, 0].plot(s["wall_clock_s"], s["reward"], marker=".", **style)
        axes[0, 1].plot(s["step_numbers"], s["reward"], marker=".", **style)
        steps = list(s["eval_cer"])
        axes[1, 0].plot([s["eval_wall_s"][k] for k in steps], [s["eval_cer"][k] for k in steps], marker="o", **style)
        axes[1, 1].plot(steps, [s["eval_cer"][k] for k in steps], marker="o", **style)
    for (i, j), (y, x) in {(0, 0): ("training reward (reward/total)", "wall-clock (s)"),
                           (0, 1): ("training reward (reward/total)", "step"),
                           (1, 0): ("held-out CER (eval/cer)", "wall-clock (s)"),
                           (1, 1): ("held-out CER (eval/cer)", "step")}.items():
        axes[i, j].set(xlabel=x, ylabel=y)
        axes[i, j].grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Reward and CER per run: {report['selection']}")
    return _save(fig, path)


def step_latency(report: dict, path: Path) -> Path:
    """The distribution of step times per configuration (seeds pooled)."""
    rows = report["rows"]
    fig = Figure(figsize=(10, 1.2 + 0.6 * len(rows)))
    ax = fig.subplots()
    data = [[t for r in report["runs"] if r["label"] == row["label"] for t in r["summary"]["step_s"]] for row in rows]
    box = ax.boxplot(data, orientation="horizontal", patch_artist=True, tick_labels=[row["label"] for row in rows])
    for patch, row in zip(box["boxes"], rows):
        patch.set_facecolor(_colors(report)[row["label"]])
        patch.set_alpha(0.5)
    ax.set(xlabel="step time, perf/time/step (s)", title="Step latency per configuration (all steps, all seeds)")
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _grouped_bars(ax, report: dict, categories: list[str], value) -> None:
    """One bar group per category, one bar per configuration: value(row, category) -> (mean, sd)."""
    rows, colors = report["rows"], _colors(report)
    width = 0.8 / max(1, len(rows))
    for i, row in enumerate(rows):
        means, sds = zip(*(value(row, c) for c in categories)) if categories else ((), ())
        ax.bar([k + i * width for k in range(len(categories))], means, width, yerr=sds, capsize=3,
               color=colors[row["label"]], label=row["label"])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(categories))], categories)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)


def _mean_sd(agg: dict | None) -> tuple[float, float]:
    if not agg or agg["n_finite"] == 0:
        return 0.0, 0.0
    sd = agg["sd"]
    return agg["mean"], sd if sd == sd else 0.0


def utilization(report: dict, path: Path) -> Path:
    """Busy / wall time of each role per configuration (error bars: sd over seeds)."""
    fig = Figure(figsize=(10, 5))
    ax = fig.subplots()
    _grouped_bars(ax, report, report["roles"], lambda row, role: _mean_sd(row["metrics"].get(f"util_{role}")))
    ax.set(ylabel="utilization (perf/util/<role>)", ylim=(0, 1.05), title="Utilization per role")
    return _save(fig, path)


def overlap_controllers(report: dict, path: Path) -> Path:
    """The Δ (overcommitted prompt groups) and chunk-size trajectories of the overlapped runs."""
    fig = Figure(figsize=(10, 6))
    ax_delta, ax_chunk = fig.subplots(2, 1, sharex=True)
    drawn = 0
    for run in report["runs"]:
        s = run["summary"]
        if run["params"].get("overlap.mode") == "none" or not s["delta"]:
            continue
        style = _style(report, run)
        ax_delta.plot(s["step_numbers"], s["delta"], marker=".", **style)
        ax_chunk.plot(s["step_numbers"], s["chunk"], marker=".", **style)
        drawn += 1
    ax_delta.set(ylabel="Δ (overlap/delta)", title="OPPO controllers")
    ax_chunk.set(ylabel="chunk (overlap/chunk)", xlabel="step")
    for ax in (ax_delta, ax_chunk):
        ax.grid(alpha=0.3)
    if drawn:
        ax_delta.legend(fontsize=7)
    else:
        ax_delta.text(0.5, 0.5, "no overlapped runs (all overlap=none)", ha="center", transform=ax_delta.transAxes)
    return _save(fig, path)


def staleness(report: dict, path: Path) -> Path:
    """Share of trained sequences by staleness (policy versions between a sequence's first
    token and its update), all steps and seeds of a configuration pooled."""
    pooled: dict[str, dict[int, float]] = {}
    for run in report["runs"]:
        counts = pooled.setdefault(run["label"], {})
        for k, v in run["summary"]["staleness_counts"].items():
            counts[int(k)] = counts.get(int(k), 0.0) + v
    top = max((k for c in pooled.values() for k in c), default=0)

    def share(row, k):
        counts = pooled.get(row["label"], {})
        total = sum(counts.values())
        return (counts.get(int(k), 0.0) / total if total else 0.0), 0.0

    fig = Figure(figsize=(10, 5))
    ax = fig.subplots()
    _grouped_bars(ax, report, [str(k) for k in range(top + 1)], share)
    ax.set(xlabel="staleness (policy versions)", ylabel="share of trained sequences", ylim=(0, 1.05),
           title="Staleness histogram (overlap/staleness_count)")
    return _save(fig, path)


def seed_band(curves: list[dict[str, list]]) -> dict[str, list[float]]:
    """Several seeds' curves (``steps``, ``minutes``, ``cer``) at the steps all of them
    reached: the mean minute, and the mean, lowest and highest CER in percent."""
    steps = sorted(set.intersection(*(set(c["steps"]) for c in curves)))
    at = [{s: (m, v) for s, m, v in zip(c["steps"], c["minutes"], c["cer"])} for c in curves]
    cer = [[100 * a[s][1] for a in at] for s in steps]
    return {"steps": steps, "minutes": [sum(a[s][0] for a in at) / len(at) for s in steps],
            "mean": [sum(v) / len(v) for v in cer], "low": [min(v) for v in cer], "high": [max(v) for v in cer]}


def cer_over_minutes(variants: dict[str, list[dict]], path: Path | str) -> Path:
    """Held-out CER against minutes, one panel per eval set (bench/rl_quality.py's rows, each
    with ``curves``): a variant's mean over its seeds at the evaluations every seed reached,
    at their mean minute, and for several seeds the band from the lowest to the highest."""
    sets = sorted({name for rows in variants.values() for r in rows for name in r["curves"]},
                  key=lambda n: (n.startswith("ema/"), "conditions" in n, n))
    cols = min(3, max(1, len(sets)))
    nrows = -(-len(sets) // cols) if sets else 1
    legend_in = 0.3 + 0.35 * len(variants)   # below the panels: override lists are long
    fig = Figure(figsize=(5 * cols, 3.6 * nrows + legend_in))
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, sets):
        for i, (variant, rows) in enumerate(variants.items()):
            seeds = [r["curves"][name] for r in rows if name in r["curves"]]
            if not seeds:
                continue
            band = seed_band(seeds)
            ax.plot(band["minutes"], band["mean"], marker=".", color=f"C{i % 10}",
                    label=textwrap.fill(f"{variant} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})", 120))
            if len(seeds) > 1:
                ax.fill_between(band["minutes"], band["low"], band["high"], color=f"C{i % 10}", alpha=0.2)
        ax.set(title=name, xlabel="minutes", ylabel="CER (%)")
        ax.grid(alpha=0.3)
    for ax in axes[len(sets):]:
        ax.set_visible(False)
    fig.suptitle("Held-out CER against wall-clock minutes: mean over seeds, band lowest-highest")
    if sets:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", fontsize=8)
    return _save(fig, Path(path), bottom=legend_in / fig.get_figheight())


PLOTS = {"curves.png": curves, "step_latency.png": step_latency, "utilization.png": utilization,
         "overlap_controllers.png": overlap_controllers, "staleness.png": staleness}


def write_plots(report: dict, out_dir: Path) -> list[Path]:
    return [draw(report, Path(out_dir) / name) for name, draw in PLOTS.items()]
