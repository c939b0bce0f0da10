"""Named acoustic conditions (`data.train_conditions`, `data.heldout_conditions`) and the
held-out-conditions evaluation split.

A condition is a room, a noise and a line (`data/acoustics.py`), each optional, applied in
that order: the talker's voice reverberates in the room, noise joins it at the microphone,
and the line carries both. Its rooms are drawn once, from `data.conditions_seed` and the
condition's role and name, so every process that builds a condition hears the same rooms.

The held-out-conditions split takes the first `data.num_heldout_conditions` utterances of
the held-out-voice split (speakers no training split has) and renders them under each
held-out condition, each utterance's draws seeded by the seed, the condition and its index:
the same config gives byte-identical WAVs. The split is cached under
`<output_root>/heldout_conditions/<hash>` like the corpus, built in a temporary folder
renamed into place only when complete.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from omegaconf import OmegaConf

from asr_grpo.config.errors import ConfigError
from asr_grpo.data import acoustics
from asr_grpo.data.dataset import AsrDataset, load_first

log = logging.getLogger(__name__)

GENERATOR_VERSION = "1"
SPLIT = "heldout_conditions"
TRAIN, HELDOUT = "train", "heldout"   # the roles a condition's rooms are seeded by


@dataclass(frozen=True)
class Condition:
    """A condition ready to apply: its rooms' impulse responses and its noise and line."""
    name: str
    rirs: tuple[np.ndarray, ...]
    noise_kinds: tuple[str, ...]
    snr_db: tuple[tuple[float, float], ...]
    channel: str
    band_hz: tuple[float, float]
    companding: str

    def apply(self, audio: np.ndarray, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
        """`audio` under this condition, the room, noise kind and SNR drawn from `rng`. The
        input is not modified; the output has its length."""
        if self.rirs:
            audio = acoustics.reverberate(audio, self.rirs[int(rng.integers(len(self.rirs)))])
        if self.noise_kinds:
            kind = self.noise_kinds[int(rng.integers(len(self.noise_kinds)))]
            audio = acoustics.add_noise(audio, kind, acoustics.draw_in(rng, self.snr_db), sample_rate, rng)
        if self.channel == "telephone":
            audio = acoustics.telephone(audio, sample_rate, self.band_hz, self.companding)
        return audio


def _plain(cfg: Any) -> dict:
    """A condition's config as plain data (a dataclass or an OmegaConf node), enums as names."""
    node = cfg if OmegaConf.is_config(cfg) else OmegaConf.structured(cfg)
    return json.loads(json.dumps(OmegaConf.to_container(node, resolve=True), default=str))


def _seed(seed: int, role: str, name: str) -> list[int]:
    return [int(seed), zlib.crc32(f"{role}:{name}".encode())]


@functools.lru_cache(maxsize=32)
def _build(name: str, spec_json: str, seed: int, role: str, sample_rate: int) -> Condition:
    spec = json.loads(spec_json)
    room, noise, channel = spec["room"], spec["noise"], spec["channel"]
    rirs: tuple[np.ndarray, ...] = ()
    if room["rt60_s"]:
        rng = np.random.default_rng(_seed(seed, role, name))
        try:
            rirs = tuple(acoustics.impulse_response(
                acoustics.draw_room(rng, room["size_m"], room["distance_m"], room["rt60_s"]), sample_rate, rng)
                for _ in range(int(room["rooms"])))
        except ValueError as exc:   # no placement fits, or walls cannot absorb enough for so short an RT60
            raise ConfigError(f"data.{role}_conditions.{name}.room: {exc}") from None
    return Condition(name, rirs, tuple(noise["kinds"]), tuple(tuple(r) for r in noise["snr_db"]),
                     str(channel["kind"]), tuple(channel["band_hz"]), str(channel["companding"]))


def build_condition(name: str, cfg: Any, seed: int, role: str, sample_rate: int) -> Condition:
    """The condition `name` of config `cfg` (a ConditionConfig), its rooms seeded by `seed`
    and `role` (TRAIN or HELDOUT: a held-out room is never a training one). Built once a
    process for the same arguments."""
    return _build(name, json.dumps(_plain(cfg), sort_keys=True), int(seed), role, int(sample_rate))


def train_conditions(data_cfg: Any, names) -> dict[str, Condition]:
    """The named training conditions (`data.train_conditions`) augmentation draws from."""
    return {name: build_condition(name, data_cfg.train_conditions[name], data_cfg.conditions_seed, TRAIN,
                                  data_cfg.sample_rate) for name in names}


def _digest(source: Path, data_cfg: Any) -> str:
    key = {"source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
           "conditions": {name: _plain(c) for name, c in data_cfg.heldout_conditions.items()},
           "num": int(data_cfg.num_heldout_conditions), "seed": int(data_cfg.conditions_seed),
           "sample_rate": int(data_cfg.sample_rate), "generator_version": GENERATOR_VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _render(root: Path, name: str, condition: Condition, items: list[dict], seed: int,
            sample_rate: int) -> None:
    (root / "wavs" / name).mkdir(parents=True)
    with open(root / f"{name}.jsonl", "w", encoding="utf-8") as manifest:
        for index, item in enumerate(items):
            rng = np.random.default_rng(_seed(seed, HELDOUT, name) + [index])
            audio = condition.apply(item["audio"], sample_rate, rng)
            rel = f"wavs/{name}/{index:05d}.wav"   # the index: a user's ids may hold any character
            sf.write(root / rel, audio, sample_rate, subtype="PCM_16")
            row = {"id": f"{item['id']}@{name}", "audio": rel, "text": item["text"],
                   "language": item["language"], "keywords": item["keywords"],
                   "duration": round(len(audio) / sample_rate, 3)}
            manifest.write(json.dumps(row, ensure_ascii=False) + "\n")


def heldout_condition_manifests(source: Path | None, data_cfg: Any, output_root: str | Path) -> dict[str, Path]:
    """One manifest per held-out condition (name -> path) rendered from the held-out-voice
    manifest `source`, built on first use and cached; {} when there is no source or no
    held-out condition."""
    names = list(data_cfg.heldout_conditions)
    if source is None or not names or data_cfg.num_heldout_conditions <= 0:
        return {}

    parent = Path(output_root) / SPLIT
    final = parent / _digest(Path(source), data_cfg)
    manifests = {name: final / f"{name}.jsonl" for name in names}
    if all(p.is_file() for p in manifests.values()):
        return manifests
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-tmp-", dir=parent))
    try:
        items = load_first(AsrDataset(source, data_cfg, split="heldout_voices"), data_cfg.num_heldout_conditions)
        for name in names:
            condition = build_condition(name, data_cfg.heldout_conditions[name], data_cfg.conditions_seed,
                                        HELDOUT, data_cfg.sample_rate)
            _render(tmp, name, condition, items, data_cfg.conditions_seed, data_cfg.sample_rate)
        if final.exists():      # not a build of this code (ours appear whole): replace it
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except OSError:
            if not all(p.is_file() for p in manifests.values()):   # another process finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the held-out-conditions split %s (%d utterances x %s)", final, len(items), ", ".join(names))
    return manifests
