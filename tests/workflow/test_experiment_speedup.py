"""The standard speedup study is one experiment file that composes, validates and declares
its sweep; the compare entry's config composes; sweeps get the tracking callback."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import OmegaConf

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import validate_config
from asr_grpo.sweep import SweepCallback

register_configs()


def _compose(name: str, overrides: list[str], hydra_cfg: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(name, overrides=overrides, return_hydra_config=hydra_cfg)


def test_speedup_experiment_declares_the_standard_sweep():
    cfg = _compose("config", ["experiment=speedup"], hydra_cfg=True)
    assert dict(cfg.hydra.sweeper.params) == {"overlap": "none,oppo", "placement": "colocate,separate",
                                              "seed": "0,1"}
    assert get_class(cfg.hydra.callbacks.sweep._target_) is SweepCallback
    assert "paths.output_root" in cfg.hydra.job.config.override_dirname.exclude_keys
    cfg = _compose("config", ["experiment=speedup"])
    OmegaConf.resolve(cfg)
    validate_config(cfg)
    assert cfg.trainer.save_every == cfg.trainer.steps   # one checkpoint per job, at its end
    assert cfg.logger.experiment_name == "speedup" and cfg.logger.log_system_metrics


@pytest.mark.parametrize("overrides", [["overlap=oppo", "placement=separate", "seed=1"],
                                       ["overlap=none", "placement=colocate", "debug=fast"]])
def test_every_job_of_the_study_validates(overrides):
    cfg = _compose("config", ["experiment=speedup", *overrides])
    OmegaConf.resolve(cfg)
    validate_config(cfg)
    assert cfg.overlap.mode == overrides[0].split("=")[1] and cfg.placement.name == overrides[1].split("=")[1]


def test_compare_config_composes_typed():
    cfg = _compose("compare", ["sweep=speedup-20260101-000000", "run_ids=[a,b]", "paths.output_root=/x"])
    assert cfg.tracking_uri == "sqlite:////x/mlflow.db" and list(cfg.run_ids) == ["a", "b"]
    with pytest.raises(Exception, match="windw"):
        _compose("compare", ["windw=3"])
    with pytest.raises(Exception, match="target_frac"):
        _compose("compare", ["target_frac=high"])
