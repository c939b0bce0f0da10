"""One source for model shapes: a forecast model (conf/forecast_model) named like a model the
toolkit builds (conf/model) has the shape the builder gives that model, because it reads it
from there; an edit in conf/model reaches the forecast, and a shape written in one place only
is caught."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from asr_grpo.config import model_shapes, register_configs
from asr_grpo.config.schema import ModelConfig
from asr_grpo.config.store import CONF_DIR
from asr_grpo.models import architecture_config

CONF = Path(CONF_DIR)
BUILT = sorted({p.stem for p in (CONF / "forecast_model").glob("*.yaml")}
               & {p.stem for p in (CONF / "model").glob("*.yaml")})
# forecast field -> the built decoder's config field (transformers' Qwen3 text_config)
SHAPE_FIELDS = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
                "kv_heads": "num_key_value_heads", "head_dim": "head_dim",
                "intermediate": "intermediate_size", "vocab": "vocab_size",
                "tie_embeddings": "tie_word_embeddings"}


class SizedTokenizer:
    """What the builder reads of a tokenizer: its size and some special-token ids. Sized as
    the tokenizer a fresh model trains (model.tokenizer_vocab_size)."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def convert_tokens_to_ids(self, token: str) -> int:
        return 0


def forecast_model(name: str, *overrides: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("forecast", overrides=[f"forecast_model={name}", "log_to_mlflow=false", *overrides])
    return cfg.model


def built_decoder(name: str):
    """The text decoder config the builder makes from conf/model/<name>.yaml."""
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                              OmegaConf.load(CONF / "model" / f"{name}.yaml"), {"path": ""}))
    return architecture_config(cfg, SizedTokenizer(cfg.tokenizer_vocab_size)).text_config


def shape_disagreements(forecast, decoder) -> list[str]:
    return [f"{field}: forecast={forecast[field]!r} built={getattr(decoder, built)!r}"
            for field, built in SHAPE_FIELDS.items() if forecast[field] != getattr(decoder, built)]


def test_the_built_models_have_forecast_entries():
    assert {"qwen3_asr_0p6b", "qwen3_asr_1p7b", "tiny_qwen3_asr"} <= set(BUILT)


@pytest.mark.parametrize("name", BUILT)
def test_a_forecast_model_has_the_shape_of_the_model_built_under_its_name(name):
    found = shape_disagreements(forecast_model(name), built_decoder(name))
    assert not found, f"conf/forecast_model/{name}.yaml and conf/model/{name}.yaml disagree: {found}"


def test_the_check_sees_a_shape_written_in_the_forecast_entry_only():
    edited = forecast_model("qwen3_asr_1p7b", "model.layers=30")
    assert shape_disagreements(edited, built_decoder("qwen3_asr_1p7b")) == ["layers: forecast=30 built=28"]


def test_a_shape_edited_in_conf_model_reaches_the_forecast(tmp_path, monkeypatch):
    model = OmegaConf.load(CONF / "model" / "qwen3_asr_1p7b.yaml")
    model.text_layers, model.text_heads, model.text_head_dim = 30, 32, 0   # head width: 2048 / 32
    OmegaConf.save(model, tmp_path / "qwen3_asr_1p7b.yaml")
    monkeypatch.setattr(model_shapes, "MODEL_DIR", tmp_path)
    m = forecast_model("qwen3_asr_1p7b")
    assert (m.layers, m.heads, m.head_dim, m.hidden) == (30, 32, 64, 2048)


def test_a_forecast_entry_without_a_built_model_says_which_file_it_lacks():
    m = forecast_model("qwen3_asr_1p7b", "model.name=my_asr")
    with pytest.raises(InterpolationResolutionError, match="conf/model/my_asr.yaml"):
        _ = m.layers
