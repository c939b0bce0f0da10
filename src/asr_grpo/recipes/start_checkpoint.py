"""The checkpoint an RL run starts from, made ready before any worker starts.

- `model.init=pretrained` (the default): `model.path`, any folder `from_pretrained` loads
  (or a hub id). When it is the default, the SFT checkpoint (`sft.output_dir`), and
  missing, the corpus and SFT are built first.
- `model.init=random`: fresh weights of the model group's architecture around a tokenizer
  trained on the corpus, saved once per architecture and reused: RL at real size with no
  download and no SFT, for systems benchmarks.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from asr_grpo.data import resolve_manifests
from asr_grpo.data.manifest import manifest_digest
from asr_grpo.models import checkpoint_metadata, checkpoint_problem, is_complete_checkpoint
from asr_grpo.recipes.fresh_checkpoint import corpus_texts, write_fresh_checkpoint
from asr_grpo.recipes.sft import run_sft
from asr_grpo.recipes.sft_start import check_model_path, is_sft_output

log = logging.getLogger(__name__)


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(vars(node))


def fresh_weights_dir(cfg) -> Path:
    """Where `model.init=random` keeps its checkpoint: one folder per architecture, seed
    and training text (the corpus manifests)."""
    arch = {k: v for k, v in _plain(cfg.model).items() if k not in ("path", "init", "freeze_audio_encoder")}
    key = json.dumps({"model": arch, "seed": cfg.seed, "data": _plain(cfg.data)}, sort_keys=True, default=str)
    return Path(cfg.paths.output_root) / "checkpoints" / f"fresh-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_fresh_weights(cfg) -> Path:
    path = fresh_weights_dir(cfg)
    if is_complete_checkpoint(path):
        return path
    texts, languages = corpus_texts(cfg.data, cfg.paths.output_root)
    log.info("model.init=random: fresh weights saved to %s", path)
    return write_fresh_checkpoint(cfg.model, path, cfg.seed, texts, languages)


def other_training_data_problem(cfg, metadata: dict) -> str | None:
    """Why the SFT checkpoint (its `metadata`) was not trained on this run's training
    manifest (SFT records the manifest's digest), or None. Such a checkpoint still loads,
    but, e.g. after a corpus generator change, it never heard the current speakers."""
    manifest = resolve_manifests(cfg.data, cfg.paths.output_root).train
    current, trained = manifest_digest(manifest), metadata.get("train_manifest_sha256")
    if trained == current:
        return None
    return (f"the SFT checkpoint {cfg.model.path} was not trained on {manifest} (its digest "
            f"{trained[:12] if trained else 'was not recorded'}, the manifest's {current[:12]}): its CERs are "
            f"not those of a model trained on this data; delete the folder (RL then rebuilds it) or run "
            f"`python -m asr_grpo.sft`")


def check_start_checkpoint(cfg) -> None:
    """A ConfigError when the run cannot start from `model.path` and will not build it
    (only SFT's own output folder is built, and `model.init=random`'s weights): cheap, so
    the run checks it before it builds or reads anything."""
    if cfg.model.init == "pretrained" and not is_sft_output(cfg):
        check_model_path(cfg)


def prepare_start_checkpoint(cfg) -> str:
    """The folder (or hub id) the policy, reference and critic load."""
    if cfg.model.init == "random":
        return str(build_fresh_weights(cfg))
    check_start_checkpoint(cfg)
    if checkpoint_problem(cfg.model.path) is None:
        if is_sft_output(cfg) and (mismatch := other_training_data_problem(cfg, checkpoint_metadata(cfg.model.path))):
            log.warning(mismatch)
        return str(cfg.model.path)
    log.info("no SFT checkpoint at %s: building the corpus and running SFT first", cfg.model.path)
    run_sft(cfg)   # model.path is SFT's own output folder: it starts from fresh weights
    return str(cfg.model.path)
