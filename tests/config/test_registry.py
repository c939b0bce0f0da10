"""The registry every extension point uses: names in the order registered, a one-line error
listing them, each name once, and validation seeing every registry loaded."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from asr_grpo.config import registry as registry_module
from asr_grpo.config.registry import Registry, loaded_registries
from asr_grpo.config.schema import RunConfig
from asr_grpo.config.validate import ConfigError, choice_problems


@pytest.fixture
def fresh(monkeypatch):
    """Registries made by the test stay out of the run's index."""
    monkeypatch.setattr(registry_module, "_LOADED", {})


def test_register_get_and_the_names_in_order(fresh):
    shapes = Registry("test.shape")

    @shapes.register("square")
    def square(x):
        return x * x

    shapes.register("cube")(lambda x: x ** 3)
    assert square(3) == 9   # the decorator leaves the function as it was
    assert shapes.get("square") is square and shapes.get("cube")(2) == 8
    assert shapes.names() == ("square", "cube") and list(shapes) == ["square", "cube"] and len(shapes) == 2
    assert "square" in shapes and "circle" not in shapes
    with pytest.raises(ConfigError) as err:
        shapes.get("circle")
    assert str(err.value) == "test.shape=circle: expected one of square, cube"
    with pytest.raises(ValueError, match="'square' is registered already"):
        shapes.register("square")(square)
    shapes.unregister("cube")
    assert shapes.names() == ("square",)


def test_validation_checks_every_loaded_registry_against_its_key(fresh):
    engines = Registry("rollout.engine")
    engines.register("hf")(object)
    Registry("not.a.config.key")   # another config's registry: nothing to check here
    assert set(loaded_registries()) == {"rollout.engine", "not.a.config.key"}
    cfg = OmegaConf.structured(RunConfig)
    assert "rollout.engine=sglang: expected one of hf" not in choice_problems(cfg)
    cfg.rollout.engine = "sglang"
    assert "rollout.engine=sglang: expected one of hf" in choice_problems(cfg)
