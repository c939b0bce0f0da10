"""Every command the README shows stays true: each `python -m asr_grpo.<entry>` line
composes its config with exactly the overrides it shows (a renamed key or group fails
here), and each `make` target it names exists. What the commands then run is covered
by the suite's own tests of those entry points and by .ci/install_check.sh."""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR

REPO = Path(__file__).resolve().parents[2]
CONFIG_OF = {"run": "config", "sft": "sft", "compare": "compare", "forecast": "forecast", "init_checkpoint": "init"}


def readme_commands() -> list[str]:
    """Shell commands of the README's ```bash blocks, continuations joined, comments cut."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def entry_commands() -> list[tuple[str, list[str]]]:
    found = []
    for cmd in readme_commands():
        words = shlex.split(cmd)
        if "-m" in words and words[words.index("-m") + 1].startswith("asr_grpo."):
            at = words.index("-m") + 1
            entry = words[at].removeprefix("asr_grpo.")
            found.append((entry, words[at + 1:]))
    return found


def first_of_each_sweep(overrides: list[str]) -> list[str]:
    """A multirun's first job: `-m` dropped, `key=a,b` -> `key=a`."""
    return [o if "=" not in o else o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0]
            for o in overrides if o != "-m"]


def test_the_readme_shows_commands_of_every_entry_point():
    entries = {e for e, _ in entry_commands()}
    assert {"run", "sft", "compare"} <= entries, entries


@pytest.mark.parametrize("entry,overrides", entry_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_each_readme_command_composes_as_written(entry, overrides):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(CONFIG_OF[entry], overrides=first_of_each_sweep(overrides))
    for o in first_of_each_sweep(overrides):   # a key=value override lands where it says
        key, value = o.split("=", 1)
        if "." in key and not key.startswith(("+", "~", "hydra.")):
            assert str(OmegaConf.select(cfg, key)) == value, o


def test_each_make_target_the_readme_names_exists():
    targets = {t for cmd in readme_commands() for t in re.findall(r"^make ([\w-]+)", cmd)}
    targets |= set(re.findall(r"`make ([\w-]+)`", (REPO / "README.md").read_text()))
    assert {"run", "test"} <= targets
    for target in sorted(targets):
        done = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, f"make {target}: {done.stderr}"
