"""The recipe interface the entry point runs: setup, train, and cleanup whatever happens."""
from __future__ import annotations

import pytest

from asr_grpo.recipes.protocol import run_recipe


class Recording:
    def __init__(self, fail_in: str = ""):
        self.calls: list[str] = []
        self.fail_in = fail_in

    def _call(self, name: str):
        self.calls.append(name)
        if name == self.fail_in:
            raise RuntimeError(f"{name} failed")

    def setup(self) -> None:
        self._call("setup")

    def train(self) -> dict:
        self._call("train")
        return {"steps": 3}

    def cleanup(self) -> None:
        self._call("cleanup")


def test_a_recipe_runs_setup_train_cleanup_and_returns_the_summary():
    recipe = Recording()
    assert run_recipe(recipe) == {"steps": 3}
    assert recipe.calls == ["setup", "train", "cleanup"]


@pytest.mark.parametrize("step", ["setup", "train"])
def test_a_failure_still_cleans_up(step):
    recipe = Recording(fail_in=step)
    with pytest.raises(RuntimeError, match=f"{step} failed"):
        run_recipe(recipe)
    assert recipe.calls[-1] == "cleanup"
