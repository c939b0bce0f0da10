"""One source for a model's shape: conf/model/<name>.yaml.

A forecast model entry (conf/forecast_model/<name>.yaml) of a model the toolkit builds
reads its decoder's shape from the conf/model file of the same name through the
`model_shape` resolver (`layers: ${model_shape:text_layers}`), so each shape is written
once. The resolver is registered whenever `asr_grpo.config` is imported."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from asr_grpo.config.store import CONF_DIR

RESOLVER = "model_shape"
MODEL_DIR = Path(CONF_DIR) / "model"


def decoder_head_dim(text_hidden: int, text_heads: int, text_head_dim: int) -> int:
    """The decoder's head width: `text_head_dim`, where 0 means text_hidden / text_heads."""
    return text_head_dim or text_hidden // text_heads


def built_shape(model: dict[str, Any]) -> dict[str, Any]:
    """A conf/model file's keys with the values a model built from it has where the file
    leaves them to the builder: the head width, and a vocabulary of 0 (the tokenizer's
    size), which a tokenizer trained for fresh weights makes `tokenizer_vocab_size`."""
    head_dim = decoder_head_dim(model["text_hidden"], model["text_heads"], model["text_head_dim"])
    return {**model, "text_head_dim": head_dim,
            "vocab_size": model["vocab_size"] or model["tokenizer_vocab_size"]}


def model_shape(key: str, _parent_) -> Any:
    """`${model_shape:KEY}`: KEY of conf/model/<name>.yaml as built (`built_shape`),
    <name> being the `name` of the node that holds the interpolation."""
    name = _parent_.name
    path = MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"${{{RESOLVER}:{key}}} in model {name!r} reads conf/model/{name}.yaml, which "
                         "does not exist (a model the toolkit does not build states its shape itself)")
    shape = _built_shape_of(str(path), path.stat().st_mtime_ns)
    if key not in shape:
        raise KeyError(f"${{{RESOLVER}:{key}}}: conf/model/{name}.yaml has no key {key!r}")
    return shape[key]


@functools.lru_cache(maxsize=32)
def _built_shape_of(path: str, mtime_ns: int) -> dict[str, Any]:
    """Read once per file version: a forecast reads each shape field several times."""
    return built_shape(OmegaConf.to_container(OmegaConf.load(path), resolve=False))


def register_model_shape_resolver() -> None:
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, model_shape)
