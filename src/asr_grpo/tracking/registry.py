"""A report back into MLflow: its files as artifacts, and the best run's checkpoint as a
registered model version."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Optional

from asr_grpo.tracking.selection import Selection

MODEL_ARTIFACT = "asr_model"


def log_report(client, selection: Selection, out_dir: Path) -> str:
    """The report folder as artifacts `report/` of the sweep's parent run, or of a new
    `compare-<slug>` run when the runs were picked by id or experiment."""
    run_id = selection.parent_run_id
    if run_id is None:
        run_id = client.create_run(selection.experiment_id, run_name=f"compare-{selection.slug}",
                                   tags={"stage": "report", "compared": selection.description}).info.run_id
        client.set_terminated(run_id)
    client.log_artifacts(run_id, str(out_dir), "report")
    return run_id


def log_best_checkpoint(client, best: dict, model_name: str, selection: Selection,
                        package: Optional[Callable[[Path, Path], Path]] = None) -> dict:
    """Log the best run's last HF checkpoint and register it as a version of `model_name`
    (once per run). `package(hf_dir, folder)` writes an MLflow model around the HF folder
    (the entry point passes `asr_grpo.serving.save_transcriber`: a pyfunc that
    `mlflow.pyfunc.load_model` loads back); without it the plain HF folder is logged.
    Returns what was done."""
    from mlflow.exceptions import MlflowException

    from asr_grpo.models.step_checkpoints import latest_checkpoint, read_driver_state

    run_id, out = best["run_id"], best["params"].get("trainer.output_dir", "")
    try:
        ckpt = latest_checkpoint(out) if out and Path(out).is_dir() else None
    except FileNotFoundError as e:
        ckpt, why = None, str(e)
    else:
        why = f"no checkpoint in trainer.output_dir={out!r} (trainer.save_every=0, or another machine's disk)"
    if ckpt is None or not (ckpt / "hf").is_dir():
        return {"run_id": run_id, "logged": False, "reason": why}
    owner = read_driver_state(ckpt).get("mlflow_run_id")
    if owner != run_id:   # the folder was reused by a later run: its weights are not this run's
        return {"run_id": run_id, "logged": False,
                "reason": f"the checkpoint in {out} belongs to MLflow run {owner}, not {run_id}"}
    artifact = MODEL_ARTIFACT if package else "checkpoint/hf"
    folder = str(Path(artifact).parent)
    if artifact not in {a.path for a in client.list_artifacts(run_id, None if folder == "." else folder)}:
        if package:
            with tempfile.TemporaryDirectory() as tmp:
                client.log_artifacts(run_id, str(package(ckpt / "hf", Path(tmp) / MODEL_ARTIFACT)), artifact)
        else:
            client.log_artifacts(run_id, str(ckpt / "hf"), artifact)
    client.set_tag(run_id, "best_of", selection.slug)
    try:
        client.create_registered_model(model_name, description="RL fine-tuned speech LLM (HF folder), "
                                                               "best final CER of a compared sweep")
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    existing = [v for v in client.search_model_versions(f"name='{model_name}'") if v.run_id == run_id]
    version = existing[0] if existing else client.create_model_version(
        model_name, source=f"runs:/{run_id}/{artifact}", run_id=run_id,
        tags={"final_cer": f"{best['metrics']['final_cer']:.4f}", "configuration": best["label"],
              "seed": best["seed"], "selection": selection.slug})
    return {"run_id": run_id, "logged": True, "checkpoint": str(ckpt / "hf"), "model_name": model_name,
            "version": version.version, "uri": f"models:/{model_name}/{version.version}"}
