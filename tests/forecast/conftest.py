"""Compose conf/forecast.yaml as the CLI does, writing under a test's tmp folder."""
from __future__ import annotations

import pytest


def compose_forecast(tmp, *overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("forecast", overrides=[f"paths.output_root={tmp}", "log_to_mlflow=false", "plot=false",
                                              *overrides])


@pytest.fixture
def forecast_cfg(tmp_path):
    return lambda *overrides: compose_forecast(tmp_path, *overrides)
