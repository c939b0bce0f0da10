"""`python -m asr_grpo.compare`: select the runs, build the report, write and log it."""
from __future__ import annotations

from pathlib import Path

from asr_grpo.tracking.registry import log_best_checkpoint, log_report
from asr_grpo.tracking.render import markdown, write_csvs
from asr_grpo.tracking.report import best_run, build_report
from asr_grpo.tracking.selection import SAFE_TAG, SelectionError, open_store, select_runs


def compare(cfg, package_model=None) -> dict:
    """Select the runs, write `report.md`, `report.csv`, `runs.csv`, `report.json` and the
    PNG plots to the output folder, log them to MLflow, register the best run's
    checkpoint (wrapped by `package_model(hf_dir, folder)` into an MLflow model, when
    given); `cfg` is a CompareConfig. Returns what was written and logged."""
    import json

    from asr_grpo.tracking.plots import write_plots

    if not SAFE_TAG.match(cfg.model_name):
        raise SelectionError(f"model_name={cfg.model_name!r}: letters, digits and ._:@+- only")
    client, uri = open_store(cfg.tracking_uri)
    selection = select_runs(client, sweep=cfg.sweep, experiment_name=cfg.experiment_name, run_ids=cfg.run_ids)
    report = build_report(client, selection, window=cfg.window, target_frac=cfg.target_frac,
                          target_reward=cfg.target_reward, target_cer=cfg.target_cer)
    out = Path(cfg.output_dir or Path(cfg.paths.output_root) / "reports" / selection.slug).resolve()
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    (out / "report.md").write_text(table)
    files = [out / "report.md", *write_csvs(report, out)]
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    files.append(out / "report.json")
    if cfg.plots:
        files += write_plots(report, out)
    result = {"tracking_uri": uri, "selection": selection.description, "output_dir": str(out),
              "files": [str(f) for f in files], "table": table, "report": report}
    best = best_run(report)
    if cfg.register_best and best is not None:
        result["best"] = log_best_checkpoint(client, best, cfg.model_name, selection, package_model)
    if cfg.log_to_mlflow:
        result["logged_to_run"] = log_report(client, selection, out)
    return result
