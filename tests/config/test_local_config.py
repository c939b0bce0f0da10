"""The `local` slot: conf/local/default.yaml, where a machine has one, sets that machine's
paths, Ray address and MLflow URI for the run and SFT configs (the command line still
wins); without it everything composes as shipped; the example states keys that exist."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR

LOCAL = """# @package _global_
paths:
  output_root: /scratch/asr-grpo
placement:
  ray_address: auto
logger:
  tracking_uri: http://127.0.0.1:5000
"""


def this_machines_file(folder: str, names: list[str]) -> list[str]:
    return ["default.yaml"] if Path(folder).name == "local" else []


def conf_copy(tmp_path: Path, local: str | None) -> Path:
    """The shipped config tree, with `local` as its conf/local/default.yaml (None: none)."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf, ignore=this_machines_file)
    if local is not None:
        (conf / "local" / "default.yaml").write_text(local)
    return conf


def compose_from(conf: Path, name: str = "config", *overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def machine_settings(cfg) -> tuple:
    return cfg.paths.output_root, cfg.placement.ray_address, cfg.logger.tracking_uri


@pytest.mark.parametrize("name", ["config", "sft"])
def test_a_local_file_sets_this_machines_paths(tmp_path, name):
    conf = conf_copy(tmp_path, LOCAL)
    assert machine_settings(compose_from(conf, name)) == ("/scratch/asr-grpo", "auto", "http://127.0.0.1:5000")
    cli = compose_from(conf, name, "paths.output_root=/elsewhere", "debug=fast")
    assert cli.paths.output_root == "/elsewhere"                       # the command line wins
    assert cli.sft.output_dir == "/elsewhere/checkpoints/sft-debug-fast"


@pytest.mark.parametrize("name", ["config", "sft"])
def test_without_a_local_file_the_shipped_defaults_hold(tmp_path, name):
    cfg = compose_from(conf_copy(tmp_path, None), name)
    assert machine_settings(cfg) == ("outputs", "", "sqlite:///outputs/mlflow.db")


def test_the_example_names_existing_keys_at_their_defaults(tmp_path):
    conf = conf_copy(tmp_path, None)
    # composing it fails on a key the schema lacks
    assert compose_from(conf, "config", "local=example") == compose_from(conf, "config")


def test_the_local_file_is_git_ignored():
    repo = Path(CONF_DIR).parents[2]
    if shutil.which("git") is None or not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    local = Path(CONF_DIR, "local", "default.yaml").relative_to(repo)
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", str(local)], cwd=repo).returncode == 0
