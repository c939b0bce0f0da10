"""`python -m asr_grpo.compare [sweep=<tag>|run_ids=[...]|experiment_name=<name>]`: the
speedup report of a sweep (by default the latest) from its MLflow runs: a markdown and
CSV table, PNG plots, logged back to MLflow; prints the table. See
asr_grpo.tracking.report."""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR
from asr_grpo.serving import save_transcriber
from asr_grpo.tracking.compare_runs import compare
from asr_grpo.tracking.selection import SelectionError

register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="compare")
def main(cfg: DictConfig) -> dict:
    try:
        result = compare(cfg, package_model=save_transcriber)
    except SelectionError as e:   # a bad selection is the user's to fix: say what, no traceback
        raise SystemExit(f"asr_grpo.compare: {e}") from None
    print(result["table"])
    print(f"report: {result['output_dir']} ({len(result['files'])} files)")
    best = result.get("best")
    if best:
        print(f"best run {best['run_id']}: " + (f"checkpoint registered as {best['uri']}" if best["logged"]
                                                  else f"not registered: {best['reason']}"))
    if "logged_to_run" in result:
        print(f"logged to MLflow run {result['logged_to_run']} (artifacts report/)")
    return result


if __name__ == "__main__":
    main()
