"""The trained text LM reward model at `reward.text_lm_dir`, trained once per tokenizer,
training text and `reward.text_lm_*` settings: a fingerprint of the three is stored with it,
and a file lock lets several processes ask at once while one trains."""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from asr_grpo.data.dataset import resolve_manifests
from asr_grpo.data.manifest import read_manifest
from asr_grpo.models.builder import load_processor
from asr_grpo.models.checkpoint import checkpoint_metadata, is_complete_checkpoint
from asr_grpo.models.text_lm import TextLMSettings, save_text_lm, start_token_id
from asr_grpo.recipes.text_lm_training import train_text_lm

log = logging.getLogger(__name__)

# Bump when the sequence format or the training recipe changes: cached LMs rebuild.
TEXT_LM_FORMAT_VERSION = 1


def settings_from_config(reward_cfg) -> TextLMSettings:
    return TextLMSettings(hidden=int(reward_cfg.text_lm_hidden), layers=int(reward_cfg.text_lm_layers),
                          intermediate=int(reward_cfg.text_lm_intermediate),
                          steps=int(reward_cfg.text_lm_steps), batch_size=int(reward_cfg.text_lm_batch_size),
                          lr=float(reward_cfg.text_lm_lr), seed=int(reward_cfg.text_lm_seed))


def _fingerprint(tokenizer, texts: Sequence[str], languages: Sequence[str],
                 settings: TextLMSettings) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"version": TEXT_LM_FORMAT_VERSION, "settings": asdict(settings)},
                        sort_keys=True).encode())
    h.update(tokenizer.backend_tokenizer.to_str().encode())
    for t, lang in zip(texts, languages):
        h.update(f"{lang}\t{t}\n".encode())
    return h.hexdigest()[:16]


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def train_texts(cfg) -> tuple[list[str], list[str]]:
    """(texts, languages) of the training manifest (the corpus is built if missing)."""
    manifests = resolve_manifests(cfg.data, cfg.paths.output_root)
    utts = read_manifest(manifests.train, on_bad=cfg.data.on_bad_audio,
                         min_duration_s=cfg.data.min_duration_s,
                         max_duration_s=cfg.data.max_duration_s,
                         default_language=cfg.data.default_language).utterances
    return [u.text for u in utts], [u.language for u in utts]


def ensure_text_lm(cfg, tokenizer=None) -> Path:
    """Path of the trained text LM at `cfg.reward.text_lm_dir`, training it first when
    missing or stale (a different tokenizer, training text or `reward.text_lm_*`
    setting changes the fingerprint stored with it). The tokenizer defaults to the
    ASR model's (`cfg.model.path`, the SFT checkpoint). Safe to call from several
    processes at once (file lock; the save is atomic)."""
    if tokenizer is None:
        if not cfg.model.path:
            raise ValueError("ensure_text_lm needs the ASR tokenizer: pass tokenizer= or set "
                             "model.path to the (SFT) checkpoint folder")
        tokenizer = load_processor(cfg.model.path).tokenizer
    path = Path(cfg.reward.text_lm_dir)
    settings = settings_from_config(cfg.reward)
    texts, languages = train_texts(cfg)
    fingerprint = _fingerprint(tokenizer, texts, languages, settings)
    with _file_lock(path.with_name(f"{path.name}.lock")):
        if is_complete_checkpoint(path):
            if checkpoint_metadata(path).get("fingerprint") == fingerprint:
                return path
            log.info("text LM at %s is stale (tokenizer, texts or settings changed): rebuilding",
                     path)
        result = train_text_lm(tokenizer, texts, languages, settings, log_every=50)
        meta = {**result.metadata(), "fingerprint": fingerprint, "settings": asdict(settings),
                "format_version": TEXT_LM_FORMAT_VERSION, "start_id": start_token_id(tokenizer)}
        save_text_lm(result.model, tokenizer, path, meta)
        log.info("text LM trained in %.1f s (loss %.3f -> %.3f, held-out ppl %.2f): %s",
                 result.seconds, meta["loss_first10"], meta["loss_last10"],
                 meta["heldout_ppl"], path)
    return path
