"""The forecast's outputs: the figures (JSON: `modes.<mode>.step_s`, `modes.<mode>.speedup`),
a markdown table, a Gantt plot of one simulated step per mode, and an MLflow run."""
from __future__ import annotations

import json
import math
from pathlib import Path

from asr_grpo.forecast.costs import SimProfile
from asr_grpo.forecast.simulator import ModeResult
from asr_grpo.forecast.workload import Workload

ROLES = ("actor", "rollout", "ref", "critic", "reward_model")
COLORS = {"prefill": "#9ecae1", "decode": "#3182bd", "contention": "#de2d26", "stream": "#74c476",
          "drain": "#c7e9c0", "old_logprobs": "#fd8d3c", "score": "#31a354", "reward": "#756bb1",
          "train": "#e6550d", "sync": "#636363", "driver": "#bdbdbd", "remote": "#bcbddc"}


def figures(results: dict[str, ModeResult], profile: SimProfile, workload: Workload) -> dict:
    modes = {m: r.summary() for m, r in results.items()}
    base = modes.get("none") or next(iter(modes.values()))
    for s in modes.values():
        s["speedup"] = base["step_s"] / s["step_s"] if s["step_s"] > 0 else float("nan")
    lengths = [x for g in workload.sample_lengths(500) for x in g]
    lengths.sort()
    q = lambda f: float(lengths[min(len(lengths) - 1, int(f * len(lengths)))])  # noqa: E731
    return {"baseline": "none" if "none" in modes else next(iter(modes)),
            "modes": modes,
            "workload": {"prompts_per_step": workload.B, "samples_per_prompt": workload.n,
                         "trained_per_prompt": workload.train_samples or workload.n,
                         "max_new_tokens": workload.max_new_tokens,
                         "response_length": {"mean": sum(lengths) / len(lengths), "p50": q(0.5), "p90": q(0.9),
                                             "p99": q(0.99), "max": float(lengths[-1])}},
            "profile": profile.as_dict()}


def table(fig: dict) -> str:
    roles = [r for r in ROLES if any(r in s["util"] for s in fig["modes"].values())]
    remote = remote_reward(fig)
    head = ("| mode | step (s) | per sample (ms) | speedup | rollout / scoring / training / sync+driver (s) "
            + ("| reward wait (s) " if remote else "")
            + "| chunk / Δ | carried groups | stale | " + " | ".join(f"{r} busy / idle (s)" for r in roles) + " |")
    out = [head, "|" + "---|" * (8 + remote + len(roles))]
    for mode, s in fig["modes"].items():
        ph = s["phases_s"]
        plan = f"{s['chunk'] or '-'} / {s['delta']}"
        if len(s["plans"]) > 1:
            plan += " (" + ", ".join(f"{k}: {v}" for k, v in list(s["plans"].items())[:3]) + ")"
        cells = [mode, f"{s['step_s']:.3g}", f"{1e3 * s['per_sample_s']:.3g}", f"{s['speedup']:.2f}x",
                 " / ".join(f"{ph[k]:.3g}" for k in ("rollout", "scoring", "training", "sync")),
                 *([f"{s.get('reward_wait_s', 0.0):.3g}"] if remote else []), plan,
                 f"{s['carried_unfinished_groups']:.1f}", f"{100 * s['stale_share']:.0f}%"]
        cells += [f"{s['busy_s'].get(r, 0):.3g} / {s['idle_s'].get(r, s['step_s']):.3g}" for r in roles]
        out.append("| " + " | ".join(cells) + " |")
    w = fig["workload"]
    rl = w["response_length"]
    trained = w.get("trained_per_prompt", w["samples_per_prompt"])
    kept = f" ({trained} of each group's trained)" if trained != w["samples_per_prompt"] else ""
    out += ["", f"B = {w['prompts_per_step']} prompts x {w['samples_per_prompt']} samples{kept}, max "
            f"{w['max_new_tokens']} tokens; response length mean {rl['mean']:.0f}, p50 {rl['p50']:.0f}, "
            f"p90 {rl['p90']:.0f}, p99 {rl['p99']:.0f}. Chunk / Δ: the plan used most in the measured steps "
            "(others in brackets, chunk/Δ: steps). Busy: seconds a role computed per step (engines: per engine); "
            "idle: the rest." + (" Reward wait: the part of the scoring spent waiting on the reward service "
                                 f"({1e3 * fig['profile']['remote_per_seq_s']:.2f} ms a sequence) after the "
                                 "sequences went out." if remote else ""),
            "", "Profile (" + fig["profile"]["source"] + "):", *[f"- {n}" for n in fig["profile"]["notes"]]]
    return "\n".join(out)


def remote_reward(fig: dict) -> bool:
    """Whether the profile has a reward service (older profiles and local rewards: no)."""
    return fig["profile"].get("remote_per_seq_s", 0.0) > 0


def gantt(results: dict[str, ModeResult], path: Path, max_engines: int = 2) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(results), 1, figsize=(12, 2.2 + 1.6 * len(results)), squeeze=False)
    seen: set[str] = set()
    for ax, (mode, res) in zip(axes[:, 0], results.items()):
        step = res.typical_step()
        lanes: list[str] = []
        for s in step.spans:
            if s.lane not in lanes:
                lanes.append(s.lane)
        # The engine that decoded longest (the critical path) first, then the others.
        last = {}
        for s in step.spans:
            if s.lane.startswith("engine "):
                last[s.lane] = max(last.get(s.lane, 0.0), s.end)
        engines = sorted(last, key=lambda x: -last[x])
        hidden = len(engines) - max_engines
        lanes = engines[:max_engines] + [x for x in lanes if x not in engines]
        for s in step.spans:
            if s.lane not in lanes:
                continue
            y = lanes.index(s.lane)
            ax.barh(y, s.end - s.start, left=s.start - step.start, height=0.7, color=COLORS.get(s.kind, "#999999"))
            seen.add(s.kind)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([x + (f" (+{hidden} alike)" if hidden > 0 and x == engines[max_engines - 1] else "")
                            for x in lanes], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{mode}: step {step.step}, {step.step_s:.3g} s (chunk {step.chunk or '-'}, Δ {step.delta})",
                     fontsize=9, loc="left")
        ax.set_xlim(0, max(r.typical_step().step_s for r in results.values()) * 1.02)
    axes[-1, 0].set_xlabel("seconds since the step started (virtual clock)")
    fig.legend(handles=[Patch(color=COLORS[k], label=k) for k in COLORS if k in seen], loc="upper right",
               ncol=min(6, len(seen)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def clean(obj):
    """JSON without NaN/inf (null instead)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def write(fig: dict, results: dict[str, ModeResult], out_dir: Path, plot: bool = True) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "forecast.json", "table": out_dir / "forecast.md"}
    files["json"].write_text(json.dumps(clean(fig), indent=1))
    files["table"].write_text(table(fig) + "\n")
    if plot:
        files["gantt"] = gantt(results, out_dir / "gantt.png")
    return files


def log_to_mlflow(logger_cfg, config, fig: dict, files: dict[str, Path], run_name: str) -> str:
    import mlflow

    from asr_grpo.tracking import MlflowRun

    tags = {"stage": "forecast", "profile": fig["profile"]["source"]}
    with MlflowRun(logger_cfg, run_name, config=config, tags=tags) as run:
        metrics = {}
        for mode, s in fig["modes"].items():
            metrics.update({f"forecast/{mode}/step_s": s["step_s"], f"forecast/{mode}/speedup": s["speedup"],
                            f"forecast/{mode}/per_sample_s": s["per_sample_s"]})
            metrics.update({f"forecast/{mode}/util/{r}": u for r, u in s["util"].items()})
            if remote_reward(fig):
                metrics[f"forecast/{mode}/reward_wait_s"] = s["reward_wait_s"]
        run.log_metrics(metrics, step=0)
        for path in files.values():
            mlflow.log_artifact(str(path), "forecast")
        return run.run_id
