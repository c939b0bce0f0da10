"""A published size end to end on CPU: checkpoint built without a hub, SFT a few steps,
GRPO 3 steps (`overlap=oppo`, colocated, a small batch), and the decode-round cost, with
the peak memory of every stage (by role for the RL run's Ray actors) and its time.

    python bench/full_size.py                                # model=qwen3_asr_0p6b
    python bench/full_size.py --model qwen3_asr_1p7b
    python bench/full_size.py --rl-override trainer.zero_stage=0 --rl-override model.lora.rank=8
    python bench/full_size.py --model tiny_qwen3_asr --out /tmp/fs   # the seconds-long dry run

Each stage is the project's own command in a subprocess (`asr_grpo.init_checkpoint`,
`asr_grpo.sft`, `asr_grpo.run`, `bench/gpu_profile.py`) on the `debug=fast` corpus, so
what is measured is what a user runs. Memory: the resident set (RSS) of the stage's
whole process tree, sampled every 0.5 s; for the RL run also per Ray actor, named by its
role (`ray::PolicyRole...` -> PolicyRole). A stage that fails (out of memory included)
is recorded with its exit status and the tail of its output; the later stages still run
where they do not need it. Writes `<out>/full_size_<model>.json` and `.md`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from portable import code_commit, cpu_name, portable

REPO = Path(__file__).resolve().parents[1]
# debug=fast's corpus, for the checkpoint builder (which has no debug group): the same
# corpus, built once, trains its tokenizer and then feeds SFT and RL.
DEBUG_CORPUS = [f"data.corpus.num_{split}={n}" for split, n in
                (("train", 24), ("dev", 8), ("test", 8), ("rl", 8), ("heldout_voices", 8))]


def role_of(proc: psutil.Process) -> str:
    """`ray::PolicyRole.train` -> PolicyRole; other processes by their program name."""
    try:
        title = (proc.cmdline() or [proc.name()])[0]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    if title.startswith("ray::"):
        return title[len("ray::"):].split(".")[0].split(" ")[0] or "ray_worker"
    return "driver" if proc.pid == os.getpid() else Path(title).name


class PeakMemory:
    """Peak RSS of a process tree (total, and the largest per role) while it runs."""

    def __init__(self, root: psutil.Process, every_s: float = 0.5):
        self.root, self.every_s = root, every_s
        self.total, self.by_role = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                role = role_of(proc) if proc is not self.root else "command"
                self.by_role[role] = max(self.by_role.get(role, 0), rss)
            self.total = max(self.total, total)
            self._stop.wait(self.every_s)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the command's whole process group (its Ray processes included), SIGKILL
    after `grace_s`, then any descendant that left the group (a daemon in a session of its
    own): a timed-out stage leaves nothing running behind it."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def run_stage(name: str, argv: list[str], cwd: Path, timeout_s: float, log: Path | None = None,
              env: dict | None = None) -> dict:
    """One command, timed, its tree's peak memory sampled; the output's tail kept. It runs
    in a process group of its own, stopped whole at `timeout_s`. `log`: default
    `cwd/<name>.log`; `env`: extra environment variables."""
    print(f"[{name}] {' '.join(argv)}", flush=True)
    log = log or cwd / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RAY_ADDRESS": "", "HYDRA_FULL_ERROR": "1", **(env or {})})
        with PeakMemory(psutil.Process(proc.pid)) as peak:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_group(proc)
                rc = "timeout"
            except BaseException:   # the caller interrupted: the command must not outlive it
                stop_group(proc, grace_s=5.0)
                raise
    seconds = time.monotonic() - start
    gib = 1024 ** 3
    result = {"rc": rc, "seconds": round(seconds, 1), "peak_rss_gib": round(peak.total / gib, 2),
              "peak_rss_gib_by_process": {k: round(v / gib, 2) for k, v in sorted(peak.by_role.items())
                                          if v > 0.05 * gib}}
    if rc != 0:
        result["output_tail"] = portable(log.read_text()[-3000:])
    print(f"[{name}] rc {rc}, {seconds:.0f} s, peak {result['peak_rss_gib']} GiB", flush=True)
    return result


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rl_phases(tracking_uri: str) -> dict:
    """Median per-phase step times of the RL run (perf/time/*) and its memory metrics."""
    import statistics

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("stage") == "rl"]
    if not runs:
        return {}
    rid = runs[0].info.run_id
    out = {}
    for key in sorted(runs[0].data.metrics):
        if key.startswith("perf/time/"):
            values = [m.value for m in client.get_metric_history(rid, key) if m.step > 0]
            if values:
                out[key] = round(statistics.median(values), 2)
    return out


def load_seconds(checkpoint: Path) -> float:
    """A fresh process's `load_model` of the checkpoint (what every role does at start)."""
    code = ("import time; t = time.perf_counter(); from asr_grpo.models import load_model; "
            f"load_model({str(checkpoint)!r}, 'bfloat16'); print(time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(float(done.stdout.strip().splitlines()[-1]), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3_asr_0p6b", help="conf/model/<name>.yaml")
    ap.add_argument("--out", default=None, help="results folder (default bench/results/cpu_2core_full_size)")
    ap.add_argument("--sft-steps", type=int, default=3)
    ap.add_argument("--rl-steps", type=int, default=3)
    ap.add_argument("--rows", default="1,8,64", help="live rows to time a decode round at")
    ap.add_argument("--stage-timeout-s", type=float, default=1800)
    ap.add_argument("--no-decode", action="store_true", help="skip the decode-round profile")
    # float32 on CPUs without AVX512-BF16/AMX (bf16 matmuls are emulated there, several
    # times slower); the published configs' bfloat16 is the GPU setting.
    ap.add_argument("--dtype", default="float32", help="model.dtype for SFT and RL")
    ap.add_argument("--rl-override", action="append", default=[],
                    help="an extra override for the RL run (repeatable), e.g. trainer.zero_stage=0")
    args = ap.parse_args()
    out = Path(args.out or REPO / "bench" / "results" / "cpu_2core_full_size")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="full_size_"))
    load_start = round(os.getloadavg()[0], 2)
    py = sys.executable
    common = ["debug=fast", f"model={args.model}", f"model.dtype={args.dtype}", f"paths.output_root={work}",
              f"logger.tracking_uri=sqlite:///{work}/mlflow.db"]
    ckpt, sft_ckpt = work / "init", work / "sft"
    stages = {}
    stages["build"] = run_stage("build", [py, "-m", "asr_grpo.init_checkpoint", f"model={args.model}",
                                          f"paths.output_root={work}", f"output_dir={ckpt}",
                                          "model.tokenizer_vocab_size=400", *DEBUG_CORPUS], work, args.stage_timeout_s)
    if stages["build"]["rc"] == 0:
        stages["build"]["checkpoint_gib"] = round(folder_bytes(ckpt) / 1024 ** 3, 2)
        stages["build"]["load_seconds"] = load_seconds(ckpt)
        stages["sft"] = run_stage("sft", [py, "-m", "asr_grpo.sft", *common, f"model.path={ckpt}",
                                          f"sft.output_dir={sft_ckpt}", f"sft.max_steps={args.sft_steps}",
                                          "sft.ctc_warmup_steps=1", "sft.batch_size=2", "sft.eval_max_utterances=2"],
                                  work, args.stage_timeout_s)
    if stages.get("sft", {}).get("rc") == 0:
        stages["sft"]["checkpoint_gib"] = round(folder_bytes(sft_ckpt) / 1024 ** 3, 2)
        stages["rl"] = run_stage("rl", [py, "-m", "asr_grpo.run", *common, f"model.path={sft_ckpt}",
                                        "overlap=oppo", "placement=colocate", f"trainer.steps={args.rl_steps}",
                                        "trainer.prompts_per_step=2", "algorithm.n_samples_per_prompt=4",
                                        "algorithm.max_new_tokens=24", "trainer.eval_every=0",
                                        "trainer.eval_max_utterances=2", f"trainer.save_every={args.rl_steps}",
                                        f"trainer.output_dir={work / 'rl'}", *args.rl_override], work,
                                 args.stage_timeout_s)
        stages["rl"]["phases"] = rl_phases(f"sqlite:///{work}/mlflow.db")
        rl_ckpts = sorted((work / "rl").glob("step_*"))
        if rl_ckpts:
            stages["rl"]["checkpoint_gib"] = round(folder_bytes(rl_ckpts[-1]) / 1024 ** 3, 2)
    profile = work / "profile.json"
    if not args.no_decode:
        stages["decode"] = run_stage("decode", [py, str(REPO / "bench" / "gpu_profile.py"), "--shape", args.model,
                                                "--rows", args.rows, "--out", str(profile)], work,
                                     args.stage_timeout_s)
    if profile.is_file():
        stages["decode"]["profile"] = json.loads(profile.read_text())
    result = {"model": args.model, "machine": f"{platform.processor() or platform.machine()}, "
              f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 1024 ** 3:.0f} GiB",
              "cpu": cpu_name(), "commit": code_commit(), "command": portable(" ".join(sys.argv)),
              # other work on the machine shows here: times are comparable only at a low load
              "load_average_1min": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
              "stages": stages}
    path = out / f"full_size_{args.model}.json"
    path.write_text(portable(json.dumps(result, indent=1)))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
