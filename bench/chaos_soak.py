"""Chaos soak: a long GRPO run (`overlap=oppo`, `placement=separate`, the `debug=fast`
model) with a fault at random every 10-20 steps, every fault and its outcome recorded,
and the end compared with the same seed's run without faults.

    python bench/chaos_soak.py                              # 200 steps -> bench/results/cpu_2core_chaos_soak/
    python bench/chaos_soak.py --steps 40 --out /tmp/soak   # a shorter one

The run is `python -m asr_grpo.run` in a subprocess, as a user starts it, logging to a
real `mlflow server` on the loopback (bench/mlflow_server.py) and scored by a real
`asr-grpo-reward-server` over HTTP (`reward=remote`, the judge of bench/remote_reward.py
with no added wait). Faults, drawn with `--seed`:
  kill_rollout, kill_reference, kill_reward_worker  SIGKILL of that Ray actor's process
  sigterm_driver     SIGTERM to the run (a preemption); resumed with trainer.resume=true
  mlflow_blink       the tracking server killed, started again 5-10 s later
  service_down       the reward server killed, started again 3-6 s later
  service_stall      the reward server stopped (SIGSTOP) 3-6 s, then continued
A run that ends other than by the soak's SIGTERM is recorded as such and resumed too.
What the faults cost is the faulted run's wall time against the fault-free one's (a
resume also starts Ray and the actors again). At the end: every step's metrics in the
MLflow run, the last step's metrics and weights against the fault-free run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from mlflow_server import MlflowServer, answers, free_port, wait_until  # noqa: E402
from portable import portable  # noqa: E402
from remote_reward import start_judge  # noqa: E402

FAULTS = ("kill_rollout", "kill_reference", "kill_reward_worker", "sigterm_driver", "mlflow_blink",
          "service_down", "service_stall")
ACTOR_OF = {"kill_rollout": "RolloutRole", "kill_reference": "ReferenceRole",
            "kill_reward_worker": "RemoteRewardWorker"}
COMPARED = ("reward/total", "loss/policy", "policy/entropy", "kl/policy_ref")


def run_args(args, out: Path, tracking_uri: str, reward_url: str) -> list[str]:
    return [sys.executable, "-m", "asr_grpo.run", "debug=fast", "overlap=oppo", "placement=separate",
            "reward=remote", f"reward.remote.urls=[{reward_url}]", "reward.remote.timeout_s=10",
            "reward.remote.retries=8", f"paths.output_root={args.output_root}", f"logger.tracking_uri={tracking_uri}",
            "logger.log_system_metrics=false", f"trainer.steps={args.steps}", "trainer.save_every=1",
            "trainer.keep_last=2", f"trainer.eval_every={args.steps}", f"seed={args.seed}",
            f"trainer.output_dir={out}"]


def run_id(out: Path) -> str:
    """The MLflow run a run folder's latest checkpoint belongs to."""
    from asr_grpo.models import step_checkpoints as ckpt

    return ckpt.read_driver_state(ckpt.latest_checkpoint(out))["mlflow_run_id"]


def last_step(out: Path) -> int:
    from asr_grpo.models import step_checkpoints as ckpt

    latest = ckpt.latest_checkpoint(out)
    return int(ckpt.read_driver_state(latest)["step"]) if latest else 0


def actor_pid(driver: subprocess.Popen, class_name: str) -> int | None:
    """The run's own Ray worker hosting `class_name` (Ray titles it `ray::<Class>...`)."""
    for p in psutil.Process(driver.pid).children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith(f"ray::{class_name}"):
                return p.pid
        except psutil.Error:
            continue
    return None


class Soak:
    def __init__(self, args, folder: Path):
        self.args, self.folder = args, folder
        self.rng = random.Random(args.seed)
        self.mlflow = MlflowServer(folder / "mlflow")
        self.judge_port = free_port()
        self.judge: subprocess.Popen | None = None
        self.events: list[dict] = []
        self.starts = 0

    def start_judge(self) -> None:
        self.judge = start_judge(0.0, 4, self.judge_port, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: answers(f"http://127.0.0.1:{self.judge_port}/health"), 120, "the reward server to answer")

    def launch(self, out: Path, resume: bool) -> subprocess.Popen:
        cmd = run_args(self.args, out, self.mlflow.uri, f"http://127.0.0.1:{self.judge_port}/score")
        self.starts += 1
        log = open(self.folder / f"run_{self.starts}.log", "w")
        return subprocess.Popen(cmd + (["trainer.resume=true"] if resume else []), stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAY_ADDRESS": ""}, start_new_session=True)

    def inject(self, kind: str, driver: subprocess.Popen) -> str:
        if kind in ACTOR_OF:
            pid = actor_pid(driver, ACTOR_OF[kind])
            if pid is None:
                return "no such actor process"
            os.kill(pid, signal.SIGKILL)
            return f"killed pid {pid}"
        if kind == "sigterm_driver":
            os.kill(driver.pid, signal.SIGTERM)
            return "sent"
        if kind == "mlflow_blink":
            self.mlflow.stop()
            time.sleep(self.rng.uniform(5, 10))
            self.mlflow.start()
            return "restarted"
        if kind == "service_down":
            self.judge.kill()
            self.judge.wait()
            time.sleep(self.rng.uniform(3, 6))
            self.start_judge()
            return "restarted"
        if kind == "service_stall":
            self.judge.send_signal(signal.SIGSTOP)
            time.sleep(self.rng.uniform(3, 6))
            self.judge.send_signal(signal.SIGCONT)
            return "continued"
        raise ValueError(kind)

    def faulted_run(self, out: Path) -> None:
        driver = self.launch(out, resume=False)
        next_at = self.rng.randint(10, 20)
        while True:
            if driver.poll() is not None:
                rc, step = driver.returncode, last_step(out)
                if rc == 0:
                    return
                expected = self.events and self.events[-1]["kind"] == "sigterm_driver" and "exit" not in self.events[-1]
                if expected:
                    self.events[-1].update(exit=rc, checkpoint_step=step)
                else:
                    self.events.append({"kind": "run_ended", "step": step, "exit": rc})
                driver = self.launch(out, resume=True)
                continue
            step = last_step(out)
            if step >= next_at and step < self.args.steps - 2:
                kind = self.rng.choice(FAULTS)
                t0 = time.monotonic()
                detail = self.inject(kind, driver)
                self.events.append({"kind": kind, "step": step, "detail": detail,
                                    "inject_s": round(time.monotonic() - t0, 2)})
                next_at = step + self.rng.randint(10, 20)
            self._note_recoveries(step)
            time.sleep(0.5)

    def _note_recoveries(self, step: int) -> None:
        """A fault is survived once the run has finished two more steps after it."""
        for e in self.events:
            if "recovered_at_step" not in e and step >= e["step"] + 2:
                e["recovered_at_step"] = step


def compare(a: Path, b: Path, tracking_uri: str, steps: int) -> dict:
    import mlflow
    import torch
    from safetensors.torch import load_file

    from asr_grpo.models import step_checkpoints as ckpt

    client = mlflow.tracking.MlflowClient(tracking_uri)
    ids = [run_id(p) for p in (a, b)]
    out: dict = {"run_ids": ids, "metrics": {}}
    for key in COMPARED:
        points = [client.get_metric_history(i, key) for i in ids]
        hist = [{m.step: m.value for m in p} for p in points]
        last = [h.get(steps) for h in hist]
        out["metrics"][key] = {"steps_logged": [len(h) for h in hist], "points_logged": [len(p) for p in points],
                               "missing_steps": [sorted(set(range(1, steps + 1)) - set(h)) for h in hist],
                               "last": last, "max_abs_diff_all_steps": max(
                                   (abs(hist[0][s] - hist[1][s]) for s in hist[0] if s in hist[1]), default=None)}
    wa, wb = (load_file(str(ckpt.step_dir(p, steps) / "hf" / "model.safetensors")) for p in (a, b))
    out["weights_max_abs_diff"] = max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)
    out["weights_equal"] = all(torch.equal(wa[k], wb[k]) for k in wa)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_2core_chaos_soak"))
    ap.add_argument("--output-root", default=str(REPO / "outputs"))
    ap.add_argument("--work", default=None, help="scratch folder (default: <output-root>/bench/chaos_soak)")
    args = ap.parse_args()
    folder = Path(args.work or f"{args.output_root}/bench/chaos_soak")
    for old in ("faulted", "clean", "mlflow"):   # scratch of an earlier soak: its checkpoints would mix in
        shutil.rmtree(folder / old, ignore_errors=True)
    (folder / "mlflow").mkdir(parents=True, exist_ok=True)
    soak = Soak(args, folder)
    soak.mlflow.start()
    soak.start_judge()
    t0 = time.monotonic()
    try:
        soak.faulted_run(folder / "faulted")
        faulted_s = time.monotonic() - t0
        t1 = time.monotonic()
        clean = soak.launch(folder / "clean", resume=False)
        if clean.wait() != 0:
            raise SystemExit(f"the fault-free run failed: see {folder}/run_{soak.starts}.log")
        clean_s = time.monotonic() - t1
        result = {"steps": args.steps, "seed": args.seed, "faulted_wall_s": round(faulted_s, 1),
                  "clean_wall_s": round(clean_s, 1), "run_starts": soak.starts - 1,
                  "faults": soak.events,
                  "faults_by_kind": {k: sum(e["kind"] == k for e in soak.events) for k in (*FAULTS, "run_ended")},
                  "survived": sum("recovered_at_step" in e for e in soak.events),
                  "comparison": compare(folder / "faulted", folder / "clean", soak.mlflow.uri, args.steps)}
    finally:
        if soak.judge is not None:
            soak.judge.kill()
        soak.mlflow.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos_soak.json").write_text(portable(json.dumps(result, indent=1)))
    print(json.dumps({k: v for k, v in result.items() if k != "faults"}, indent=1))


if __name__ == "__main__":
    main()
