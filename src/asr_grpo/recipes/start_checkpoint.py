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

from asr_grpo.data import AsrDataset, resolve_manifests
from asr_grpo.models import checkpoint_problem, fresh_model, is_complete_checkpoint, save_hf_checkpoint
from asr_grpo.recipes.sft import is_sft_output, run_sft

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
    manifests = resolve_manifests(cfg.data, cfg.paths.output_root)
    utts = AsrDataset(manifests.train, cfg.data).utterances
    model, processor = fresh_model(cfg.model, [u.text for u in utts], seed=cfg.seed,
                                   languages=[u.language for u in utts])
    log.info("model.init=random: fresh weights saved to %s", path)
    return save_hf_checkpoint(model, processor, path, {"init": "random"})


def prepare_start_checkpoint(cfg) -> str:
    """The folder (or hub id) the policy, reference and critic load."""
    if cfg.model.init == "random":
        return str(build_fresh_weights(cfg))
    problem = checkpoint_problem(cfg.model.path)
    if problem is None:
        return str(cfg.model.path)
    if not is_sft_output(cfg):
        raise FileNotFoundError(f"model.path={cfg.model.path!r}: {problem}")
    log.info("no SFT checkpoint at %s: building the corpus and running SFT first", cfg.model.path)
    run_sft(cfg)   # model.path is SFT's own output folder: it starts from fresh weights
    return str(cfg.model.path)
