"""`python -m asr_grpo.forecast [profile=roofline|run|file] [forecast_gpu=h100] [forecast_model=...]
[forecast_scenario=...] [json=PATH | --json PATH]`: OPPO's predicted step time and speedup for
none|intra|inter|oppo (docs/forecast.md)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR
from asr_grpo.forecast.run import run_forecast

register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="forecast")
def main(cfg: DictConfig) -> dict:
    try:
        result = run_forecast(cfg)
    except (ValueError, FileNotFoundError) as e:   # a bad profile source is the user's to fix: say what
        raise SystemExit(f"asr_grpo.forecast: {e}") from None
    print(result["table"])
    print("files: " + ", ".join(str(p) for p in result["files"].values()))
    if result["run_id"]:
        print(f"logged to MLflow run {result['run_id']} (artifacts forecast/)")
    return result


def json_flag(argv: list[str]) -> list[str]:
    """`--json PATH` (or `--json=PATH`) as the Hydra override `json=PATH`."""
    out, args = [], iter(argv)
    for a in args:
        if a == "--json":
            out.append(f"json={next(args, '')}")
        elif a.startswith("--json="):
            out.append("json=" + a.split("=", 1)[1])
        else:
            out.append(a)
    return out


def cli() -> None:
    sys.argv = [sys.argv[0], *json_flag(sys.argv[1:])]
    main()


if __name__ == "__main__":
    cli()
