"""A forecast from its config: build the profile, simulate every mode, write and log the figures."""
from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asr_grpo.forecast import profiles, report
from asr_grpo.forecast.simulator import simulate


def output_dir(cfg) -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    return Path(cfg.paths.output_root) / "forecast" / time.strftime("%Y%m%d-%H%M%S")


def run_forecast(cfg: DictConfig) -> dict:
    """Returns {"figures", "table", "files", "run_id"}; `cfg` is a composed conf/forecast.yaml."""
    profile, workload = profiles.build(cfg)
    results = simulate(profile, workload, cfg.overlap, list(cfg.modes), int(cfg.steps), int(cfg.warmup),
                       cfg.reward_trend)
    fig = report.figures(results, profile, workload)
    fig["config"] = {"profile": cfg.profile, "gpu": cfg.gpu.name, "model": cfg.model.name,
                     "placement": cfg.placement.name, "lengths": cfg.lengths.name, "workload": cfg.workload.name,
                     "steps": int(cfg.steps), "warmup": int(cfg.warmup), "reward_trend": cfg.reward_trend,
                     "overlap": OmegaConf.to_container(cfg.overlap, resolve=True)}
    files = report.write(fig, results, output_dir(cfg), bool(cfg.plot))
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(files["json"].read_text())
        files["json_copy"] = Path(cfg.json)
    run_id = None
    if cfg.log_to_mlflow:
        source = cfg.model.name if cfg.profile != "run" else (cfg.run.run_id[:8] or "summary")
        run_id = report.log_to_mlflow(cfg.logger, cfg, fig, {k: v for k, v in files.items() if k != "json_copy"},
                                      f"forecast-{cfg.profile}-{source}")
    return {"figures": fig, "table": report.table(fig), "files": files, "run_id": run_id}
