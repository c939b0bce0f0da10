"""`python -m asr_grpo.run overlap=oppo placement=colocate`: RL post-training (GRPO/PPO)
of the SFT'd speech LLM on Ray + DeepSpeed, logged to MLflow.

`python -m asr_grpo.run -m overlap=none,oppo seed=0,1` (or `-m experiment=speedup`): a
sweep, one MLflow run per job under one parent run; see asr_grpo.sweep."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Iterator

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.errors import ConfigError, one_line_errors
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import validate_config
from asr_grpo.recipes.stop import RunStopped, stop_signals
from asr_grpo.sweep import current_sweep_job

log = logging.getLogger(__name__)
register_configs()


def command_overrides() -> str:
    """The command line's overrides, comma-separated (Hydra's `override_dirname`: without
    `paths.output_root` and the Ray address, which say where, not what)."""
    try:
        return HydraConfig.get().job.override_dirname
    except ValueError:   # not under @hydra.main (e.g. called from a test)
        return ""


def short_run_name(cfg: DictConfig, overrides: str) -> str:
    """`grpo-oppo-colocate-s0-1a2b3c`: what a run list is read by, and a hash of the
    overrides that tells apart runs differing elsewhere (the overrides are a param)."""
    digest = hashlib.sha1(overrides.encode()).hexdigest()[:6]
    return f"{cfg.algorithm.name}-{cfg.overlap.mode}-{cfg.placement.name}-s{cfg.seed}-{digest}"


def resume_hint(output_root: str) -> str:
    """Where a resumable run could be: the newest run folders holding a checkpoint."""
    found = sorted(Path(output_root).glob("runs/*/*/checkpoints/step_*"), key=lambda p: p.stat().st_mtime)
    folders = list(dict.fromkeys(str(p.parent) for p in reversed(found)))[:3]
    return ("trainer.resume=true continues one run: name its checkpoint folder with trainer.output_dir=..."
            + (f" (newest: {', '.join(folders)})" if folders else f" (no run under {output_root}/runs has one)"))


def resume_command(cfg: DictConfig) -> str:
    """The command that continues this run: its own overrides, with trainer.resume=true and
    trainer.output_dir naming its checkpoint folder (instead of any the command had)."""
    try:
        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:   # not under @hydra.main
        overrides = []
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("trainer.resume", "trainer.output_dir")]
    return shlex.join(["python", "-m", "asr_grpo.run", *kept, "trainer.resume=true",
                       f"trainer.output_dir={cfg.trainer.output_dir}"])


def stopped_line(cfg: DictConfig, stopped: RunStopped) -> str:
    """One line: what the signal stopped, the checkpoint a resume continues from, the command."""
    from asr_grpo.models import step_checkpoints as ckpt

    latest = ckpt.latest_checkpoint(cfg.trainer.output_dir) if Path(cfg.trainer.output_dir).is_dir() else None
    start = f"from {latest.name}" if latest else "from the start (no checkpoint was written)"
    return f"asr_grpo.run: {stopped}; resume {start}: {resume_command(cfg)}"


@contextlib.contextmanager
def stopping_with_resume_line(cfg: DictConfig) -> Iterator[None]:
    """SIGTERM or SIGINT ends the run as recipes/stop.py says, then the process: one line
    with the resume command on stderr, exit status 128 + the signal (143, 130), no traceback."""
    stop = stop_signals().install()
    try:
        with stop.immediate():
            yield
    except RunStopped as stopped:
        print(stopped_line(cfg, stopped), file=sys.stderr, flush=True)
        raise SystemExit(stopped.exit_code) from None


def own_checkpoint_folder(cfg: DictConfig) -> None:
    """A run checkpoints into its own Hydra run folder, so runs never overwrite each
    other, unless the command line names trainer.output_dir (which resuming needs)."""
    hc = HydraConfig.get()
    if "trainer.output_dir" in {o.split("=", 1)[0].lstrip("+~") for o in hc.overrides.task}:
        return
    if cfg.trainer.resume:
        raise ConfigError(resume_hint(cfg.paths.output_root))
    cfg.trainer.output_dir = str(Path(hc.runtime.output_dir) / "checkpoints")


def train(cfg: DictConfig, tags: dict | None = None) -> dict:
    validate_config(cfg)   # before anything starts: a bad combination names its keys
    from asr_grpo.recipes.rl import run_rl  # heavy imports after validation

    overrides = command_overrides()
    summary = run_rl(cfg, run_name=short_run_name(cfg, overrides), tags=tags, overrides=overrides)
    print(json.dumps(summary, indent=2, default=str))
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    if before and after:
        print(f"held-out CER {before['cer']:.3f} -> {after['cer']:.3f} after {summary['steps']} steps "
              f"({summary['train_seconds'] / 60:.1f} min)")
    return summary


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> dict:
    job = current_sweep_job()   # `-m`: one job of a sweep (see asr_grpo.sweep)
    if job is None:
        with one_line_errors("asr_grpo.run"), stopping_with_resume_line(cfg):   # say what, not a traceback
            own_checkpoint_folder(cfg)
            return train(cfg)
    job.prepare(cfg)
    return job.run(lambda: train(cfg, tags=job.tags), resume=lambda: resume_command(cfg))


if __name__ == "__main__":
    main()
