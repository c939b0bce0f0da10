"""Register the schemas with Hydra's ConfigStore: each `conf/<group>/*.yaml` is merged
into its typed node, so unknown keys and wrong types fail before anything starts."""
from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore

from asr_grpo.config.schema import CompareConfig, ForecastConfig, InitConfig, RunConfig

# The config tree ships inside the package (asr_grpo/conf, package data), so an installed
# package finds it from any folder; the repository's top-level `conf` is a symlink to it.
# Entry points point Hydra here (an absolute path: the cwd plays no part).
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(name="compare_schema", node=CompareConfig)
    cs.store(name="forecast_schema", node=ForecastConfig)
    cs.store(name="init_schema", node=InitConfig)
