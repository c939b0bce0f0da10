"""The `remote_reward` benchmark: what overlap buys when the reward is served by another
machine. overlap=none against oppo (and any other mode asked for), side by side, for
several service settings, with every speedup's 95% interval and the ideal it is held to.

    python bench/remote_reward.py                                     # every setting, none + oppo, 2 repeats
    python bench/remote_reward.py --settings full --modes none oppo intra --repeats 3 --steps 24
    python bench/remote_reward.py --from-json bench/results/cpu_2core_remote_reward/remote_reward.json

How the wait is made (this machine has no second box to run a judge on): the real
`asr-grpo-reward-server` runs here with `bench/judge_reward.py`, which serves
`slots` sequences at once for `seconds_per_sequence` each, first come first served over
every request in flight, in `time.sleep` (no local core used, as a remote GPU uses none
of ours), and then scores with the built-in ASR reward; the trainer reaches it over
loopback through `bench/delay_proxy.py`, which delays every byte by `one_way_s` each
way. So the service scores `slots / seconds_per_sequence` sequences a second, whatever
the requests' sizes (as a batching server would), and every request pays
2 x one_way_s of network on top. The server and the proxy stand for another machine and
its network. By default (`--cores split`) they run on the box's last core and the
trainer (this process, Ray and every actor it starts) on the others: the service's own
CPU work never lands on a trainer core, as on another machine, and the trainer's torch
threads follow the cores it has (`workers/threads.node_cores`). With `--cores shared`
they share every core with the trainer. Either way the client side (the rollout host's sends,
the reward worker's HTTP client) runs on the trainer's cores, as with a real service.

The ideal (what a perfect pipeline could hide): every sequence sent the moment its last
token is sampled (its `finished_at`), served first come first served on the `slots`,
answered after the round trip; what of the step's measured reward wait is left after
the decode ends is the exposed part. Computed per serial step from that step's own
finish times; the ideal step is the measured one less what could be hidden.

Each run is a real `run_rl` (Ray, DeepSpeed, MLflow) from the same SFT checkpoint and
seed; figures come back from MLflow (step times) and from a step callback (finish
times). Repeat 0 runs `none` first, and the forecast's prediction from that run is
written before any other mode runs; later repeats run the modes in a seeded random order.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from asr_grpo.overlap.cost_model import service_drain
from asr_grpo.tracking.speedup_ci import format_speedup, speedup_ci
from overlap_speedup import COMMON, compose_run, load_run, median, report
from portable import code_commit, cpu_name

REPO = Path(__file__).resolve().parents[1]
JUDGE = REPO / "bench" / "judge_reward.py"

# name: (seconds per sequence per slot, slots, one-way latency s). With the recipe's
# 8 prompts x 32 samples = 256 sequences a step, the serial wait the service adds is
# 256 x s / slots + 2 x latency: 0 / 0.69 / 1.33 s, the last as long as the rollout
# (~1.3 s on 2 EPYC cores).
SETTINGS = {
    "direct": (0.0, 4, 0.0),
    "half": (0.010, 4, 0.025),
    "full": (0.020, 4, 0.025),
}
# `make run`'s recipe (nothing pinned: 32 samples a prompt, 8 of them trained) with the
# reward sent to the service, fed as sequences finish; the client may keep every slot busy.
WORKLOAD = ["reward.remote.feed=true", "reward.remote.batch_size=16", "reward.remote.max_in_flight=8", "reward.remote.timeout_s=60"]
# Requests the judge's server scores at once (threads that mostly wait on the slots).
REQUESTS_ADMITTED = 64
CALLBACK_KEYS = ("perf/time/step", "perf/time/reward_wait", "perf/time/rollout", "perf/time/rollout_decode",
                 "perf/time/scoring_wall", "perf/time/training", "perf/time/sync", "overlap/chunk", "overlap/delta",
                 "overlap/rows_decoded", "reward/total")


def split_cores() -> tuple[set[int], set[int]]:
    """(the trainer's cores, the service's core): the last core is the service's."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--cores split needs 2 or more cores (the service takes one); use --cores shared")
    return set(cores[:-1]), {cores[-1]}


def start_judge(seconds_per_sequence: float, slots: int, port: int, **popen) -> subprocess.Popen:
    """`asr-grpo-reward-server` with the judge on `port` (not waited for): `slots`
    sequences served at once; the server admits far more requests than the client keeps
    in flight, so only the judge's slots bound it."""
    env = {**os.environ, "ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE": str(seconds_per_sequence),
           "ASR_GRPO_JUDGE_SLOTS": str(slots)}
    return subprocess.Popen([sys.executable, "-m", "asr_grpo.rewards.server", "--port", str(port),
                             "--reward-file", str(JUDGE), "--concurrency", str(REQUESTS_ADMITTED),
                             "--max-queue", "1024", "--log-level", "warning"], env=env, **popen)


def start_service(setting: tuple[float, int, float], port: int, cores: set[int] | None) -> tuple[list[subprocess.Popen], str]:
    """The judge server on `port` and the delaying proxy in front of it, each its own
    process on `cores` (None: any): (the processes, the URL the trainer posts to)."""
    per_seq, slots, one_way = setting
    preexec = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    procs = [start_judge(per_seq, slots, port, preexec_fn=preexec),
             subprocess.Popen([sys.executable, str(REPO / "bench" / "delay_proxy.py"), str(port), str(one_way),
                               "--port", str(port + 1)], preexec_fn=preexec)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/health", timeout=2) as r:
                if r.status == 200:
                    return procs, f"http://127.0.0.1:{port + 1}/score"
        except OSError:
            time.sleep(0.5)
        if any(p.poll() is not None for p in procs):
            break
    stop_service(procs)
    raise RuntimeError("the judge server or its proxy exited, or /health did not answer through the "
                       "proxy within 120 s")


def stop_service(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


def step_record(trained) -> dict:
    """What the ideal needs of one step: when decoding began and ended, when each
    sample's last token came, and the step's phase times."""
    r = trained.rollout
    return {"step": trained.step, "started_at": r.started_at, "decoded_at": r.decoded_at,
            "finished_at": [s.finished_at for rs in r.results.values() for s in rs],
            **{k: trained.metrics.get(k) for k in CALLBACK_KEYS}}


def ideal_step(rec: dict, setting: tuple[float, int, float]) -> tuple[float, float]:
    """(the step with what a perfect pipeline hides taken off, the exposed wait it leaves)."""
    per_seq, slots, one_way = setting
    arrivals = [f - rec["started_at"] for f in rec["finished_at"] if f is not None]
    decoded = rec["decoded_at"] - rec["started_at"]
    exposed = max(0.0, service_drain(arrivals, per_seq, slots, 2 * one_way) - decoded)
    wait = rec["perf/time/reward_wait"] or 0.0
    return rec["perf/time/step"] - max(0.0, wait - exposed), exposed


def same_work(a: list[dict], b: list[dict]) -> bool:
    """Whether two runs' steps did the same work, step for step (the same rows decoded
    and the same mean reward: the same tokens sampled), so step i of one pairs with step i
    of the other and the interval leaves out what the steps' own work varies by."""
    work = lambda r: (r.get("overlap/rows_decoded"), r.get("reward/total"))  # noqa: E731
    return len(a) == len(b) and all(None not in work(x) and work(x) == work(y) for x, y in zip(a, b))


def finish_spread(records: list[dict]) -> dict:
    """Finish times as shares of the decode (p10/p50/p90 over every sample of the steps)."""
    shares = sorted((f - r["started_at"]) / max(1e-9, r["decoded_at"] - r["started_at"])
                    for r in records for f in r["finished_at"] if f is not None)
    if not shares:
        return {}
    q = lambda p: shares[min(len(shares) - 1, int(p * len(shares)))]  # noqa: E731
    return {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9)}


def analyse(name: str, setting: tuple, runs: dict[str, list[dict]], timelines: dict[str, list[list[dict]]],
            warmup: int, window: int, forecast: dict | None, cores: dict | None = None) -> dict:
    base = report(f"remote_reward/{name}", [*WORKLOAD], runs, window)
    measured = {m: [[r for r in tl if r["step"] + 1 > warmup] for tl in tls] for m, tls in timelines.items()}
    serial = measured["none"]
    ideals = [[ideal_step(r, setting) for r in tl] for tl in serial]   # (ideal step, exposed wait)
    actual = [[r["perf/time/step"] for r in tl] for tl in serial]
    ideal_ci = speedup_ci(actual, [[step for step, _ in tl] for tl in ideals], paired=True)
    per_step = len(serial[0][0]["finished_at"]) if serial and serial[0] else 0
    base.update({
        "setting": {"seconds_per_sequence": setting[0], "slots": setting[1], "one_way_latency_s": setting[2],
                    "sequences_per_second": setting[1] / setting[0] if setting[0] else None,
                    "cores": cores},
        "serial_reward_wait_s": median([r["perf/time/reward_wait"] for tl in serial for r in tl]),
        # what the service alone adds to a serial step: every sequence through its slots, one round trip
        "nominal_serial_wait_s": per_step * setting[0] / setting[1] + 2 * setting[2],
        "ideal_speedup": ideal_ci.to_dict(),
        "ideal_exposed_wait_s": median([exposed for tl in ideals for _, exposed in tl]),
        "finish_spread": finish_spread([r for tl in serial for r in tl]),
        "forecast": forecast,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "code_commit": code_commit(),
    })
    for mode, rows in base["modes"].items():
        paired = len(serial) == len(measured[mode]) and all(same_work(a, b) for a, b in zip(serial, measured[mode]))
        mode_ci = speedup_ci(actual,
                             [[r["perf/time/step"] for r in tl] for tl in measured[mode]], paired=paired)
        rows["step_speedup_ci"] = mode_ci.to_dict()
        ideal_gain = ideal_ci.point - 1.0
        rows["share_of_ideal"] = (mode_ci.point - 1.0) / ideal_gain if ideal_gain > 1e-9 else None
    return base


def markdown(results: list[dict]) -> str:
    out = ["| setting | service | serial reward wait (measured / nominal) | decode finish p10/p50/p90 "
           "| ideal speedup | mode | step speedup [95% CI] | share of ideal | chunk / Δ used | forecast |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["setting"]
        service = (f"{s['slots']} slots x {1e3 * s['seconds_per_sequence']:.0f} ms/seq, "
                   f"RTT {2e3 * s['one_way_latency_s']:.0f} ms"
                   + (f"; trainer on {len(s['cores']['trainer'])} core(s), service on {len(s['cores']['service'])}"
                      if s.get("cores") else ""))
        spread = r["finish_spread"]
        spread_s = "/".join(f"{spread[k]:.2f}" for k in ("p10", "p50", "p90")) if spread else "-"
        for mode, m in r["modes"].items():
            if mode == "none":
                continue
            share = f"{100 * m['share_of_ideal']:.1f}%" if m.get("share_of_ideal") is not None else "-"
            used = f"{'/'.join(str(int(c)) for c in m['chunks'])} / {'/'.join(str(int(d)) for d in m['deltas'])}"
            fc = (r.get("forecast") or {}).get(mode)
            paired = " (paired)" if m["step_speedup_ci"].get("method") == "paired" else ""
            out.append(f"| {r['workload'].split('/')[-1]} | {service} | {r['serial_reward_wait_s']:.2f} / "
                       f"{r['nominal_serial_wait_s']:.2f} s | {spread_s} | {format_speedup(r['ideal_speedup'])} | "
                       f"{mode} | {format_speedup(m['step_speedup_ci'])}{paired} | {share} | {used} | "
                       f"{f'{fc:.2f}x' if isinstance(fc, (int, float)) else '-'} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--modes", nargs="+", default=["none", "oppo"])
    ap.add_argument("--steps", type=int, default=20, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=6,
                    help="first steps left out (start-up, and the cost model's serial fitting steps)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--order-seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=18431, help="the judge server's port (its proxy: the next one)")
    ap.add_argument("--cores", choices=["split", "shared"], default="split",
                    help="split: the service (server, proxy) on the last core, the trainer on the others; "
                         "shared: everything on every core")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_2core_remote_reward"))
    ap.add_argument("--output-root", default=str(REPO / "outputs"))
    ap.add_argument("--from-json", help="re-render an earlier result")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    if args.from_json:
        print(markdown(json.loads(Path(args.from_json).read_text())))
        return
    if args.modes[0] != "none":
        sys.exit("--modes must start with none: the serial baseline, and the forecast's input")

    import mlflow

    from asr_grpo.recipes.rl import run_rl
    from asr_grpo.tracking import absolute_tracking_uri

    service_cores = None
    cores_used = None
    if args.cores == "split":   # before Ray starts: its processes inherit this process's cores
        trainer_cores, service_cores = split_cores()
        os.sched_setaffinity(0, trainer_cores)
        cores_used = {"trainer": sorted(trainer_cores), "service": sorted(service_cores)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.order_seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = []
    for name in args.settings:
        setting = SETTINGS[name]
        service, url = start_service(setting, args.port, service_cores)
        runs: dict[str, list[dict]] = {m: [] for m in args.modes}
        timelines: dict[str, list[list[dict]]] = {m: [] for m in args.modes}
        forecast = None
        try:
            for rep in range(args.repeats):
                order = list(args.modes)
                if rep:
                    rng.shuffle(order)
                for mode in order:
                    overrides = [f"paths.output_root={args.output_root}", f"overlap={mode}", *WORKLOAD,
                                 f"reward.remote.urls=[{url}]", *COMMON, f"trainer.steps={args.steps}",
                                 f"trainer.eval_every={args.steps}",
                                 f"trainer.output_dir={args.output_root}/bench/remote-{name}-{mode}",
                                 "logger.experiment_name=bench-remote-reward", *args.overrides]
                    print(f"== remote_reward {name} / overlap={mode} / repeat {rep}", flush=True)
                    timeline: list[dict] = []
                    summary = run_rl(compose_run(overrides), run_name=f"remote-{stamp}-{name}-{mode}-r{rep}",
                                     step_callbacks=[lambda t, timeline=timeline: timeline.append(step_record(t))])
                    client = mlflow.tracking.MlflowClient(absolute_tracking_uri(
                        f"sqlite:///{args.output_root}/mlflow.db"))
                    runs[mode].append(load_run(client, summary["mlflow_run_id"], args.window, args.warmup))
                    timelines[mode].append(timeline)
                    steps = [r["perf/time/step"] for r in timeline[args.warmup:]]
                    print(f"   mean step {statistics.fmean(steps):.2f} s", flush=True)
                    if mode == "none" and rep == 0:
                        forecast = predict_first(summary["mlflow_run_id"], out / f"forecast_{name}.json",
                                                 args.output_root)
        finally:
            stop_service(service)
        results.append(analyse(name, setting, runs, timelines, args.warmup, args.window, forecast,
                               cores_used))
        (out / "remote_reward.json").write_text(json.dumps(results, indent=1))
        (out / "remote_reward.md").write_text(markdown(results))
    print(markdown(results))


def predict_first(run_id: str, path: Path, output_root: str) -> dict | None:
    """The forecast's speedups from the first serial run, written to `path` before any
    other mode runs (`bench/forecast_validation.py` compares them afterwards)."""
    cmd = [sys.executable, str(REPO / "bench" / "forecast_validation.py"), "--remote-predict", run_id,
           "--prediction-out", str(path), "--output-root", output_root]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not path.exists():
        print(f"   forecast failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    return json.loads(path.read_text()).get("speedups")


if __name__ == "__main__":
    main()
