"""One source of defaults: the option each group uses by default (conf/config.yaml's
`defaults:`) states the same values as the schema's dataclass defaults, so code that
builds a config from the schema alone (tests, the forecast, a user's script) runs what
`python -m asr_grpo.run` runs."""
from __future__ import annotations

from enum import Enum
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from asr_grpo.config.schema import RunConfig
from asr_grpo.config.store import CONF_DIR

CONF = Path(CONF_DIR)


def default_options() -> list[tuple[str, str]]:
    out = []
    for entry in yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            (group, option), = entry.items()
            if option is not None and not group.startswith("optional "):   # local: this machine's, if any
                out.append((group, option))
    return out


def plain(value):
    """Enums as their names, containers recursively: what a YAML file would state."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def disagreements(defaults: dict, stated: dict, prefix: str) -> list[str]:
    """`key: schema=... yaml=...` for every value the YAML states differently."""
    out = []
    for key, value in stated.items():
        if key == "defaults" or key.startswith("_"):
            continue
        if key not in defaults:
            out.append(f"{prefix}{key}: not in the schema")
            continue
        if isinstance(value, str) and "${" in value:
            # an interpolation wires groups together (model.path -> sft.output_dir): no default to state
            continue
        default = plain(defaults[key])
        if isinstance(default, dict) and isinstance(value, dict) and set(value) <= set(default):
            out += disagreements(default, value, f"{prefix}{key}.")
        elif not (default == value or (isinstance(default, float) and isinstance(value, int)
                                         and float(value) == default)):
            out.append(f"{prefix}{key}: schema={default!r} yaml={value!r}")
    return out


def schema_defaults(group: str) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(RunConfig)[group], resolve=False)


@pytest.mark.parametrize("group,option", default_options())
def test_the_default_group_file_states_the_schema_defaults(group, option):
    stated = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    found = disagreements(schema_defaults(group), stated, f"{group}.")
    assert not found, f"conf/{group}/{option}.yaml and the schema disagree: {found}"


def test_the_check_sees_a_disagreement():
    defaults = schema_defaults("algorithm")
    assert disagreements(defaults, {"kl_coef": 0.5}, "algorithm.") == \
        ["algorithm.kl_coef: schema=0.01 yaml=0.5"]
    assert disagreements(defaults, {"kl_coef": 0.01, "loss_agg": "token_mean"}, "algorithm.") == []
