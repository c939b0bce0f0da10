"""Torch dataset over a validated manifest, and where the manifests come from."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from asr_grpo.config.schema import DataConfig
from asr_grpo.data.audio import AudioError, load_audio
from asr_grpo.data.corpus import CorpusManifests, build_corpus
from asr_grpo.data.manifest import Utterance, read_manifest


def uses_embedded_corpus(data_cfg: DataConfig) -> bool:
    return not any(getattr(data_cfg, f"{split}_manifest") for split in ("train", "dev", "test"))


def max_duration_limit(data_cfg: DataConfig) -> float:
    """`data.max_duration_s`, raised to `data.corpus.longform_max_s` when the embedded
    corpus has long-form dictation: audio the config asked for is not absurd."""
    limit = float(data_cfg.max_duration_s)
    corpus = data_cfg.corpus
    if uses_embedded_corpus(data_cfg) and corpus.longform_fraction > 0:
        limit = max(limit, float(corpus.longform_max_s))
    return limit


class AsrDataset(Dataset):
    """Utterances of one manifest; audio is loaded lazily as float32 mono at
    `data_cfg.sample_rate`.

    Lines are validated when the dataset is built (`data_cfg.on_bad_audio`: "error"
    raises, "skip" drops them and lists `(line, reason)` in `skipped`). Problems only
    the samples show (silence, NaN, a file that stopped decoding) surface on loading:
    `item[i]` raises `AudioError` naming the file and manifest line in both modes;
    `load(i)` follows the policy (raises, or returns None and adds the line to
    `skipped`, which so counts both kinds).
    """

    def __init__(self, manifest_path: str | Path, data_cfg: DataConfig) -> None:
        self.manifest_path = Path(manifest_path)
        self.sample_rate = int(data_cfg.sample_rate)
        self.min_duration_s = float(data_cfg.min_duration_s)
        self.max_duration_s = max_duration_limit(data_cfg)
        result = read_manifest(manifest_path, on_bad=data_cfg.on_bad_audio,
                               min_duration_s=self.min_duration_s,
                               max_duration_s=self.max_duration_s,
                               default_language=data_cfg.default_language)
        self.utterances: list[Utterance] = result.utterances
        self.skipped: list[tuple[int, str]] = result.skipped
        self.skip_bad = data_cfg.on_bad_audio == "skip"
        self._unusable: set[int] = set()   # indices whose audio failed to load (skip mode)

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> dict[str, Any]:
        utt = self.utterances[index]
        audio = load_audio(utt.audio, self.sample_rate, min_duration_s=self.min_duration_s,
                           max_duration_s=self.max_duration_s, manifest=utt.manifest,
                           line=utt.line)
        return {"id": utt.id, "audio": audio, "text": utt.text, "language": utt.language,
                "keywords": list(utt.keywords), "duration": len(audio) / self.sample_rate}

    def load(self, index: int) -> dict[str, Any] | None:
        """`self[index]` under the bad-audio policy: in skip mode an utterance whose
        audio fails to load is listed in `skipped` once and None is returned (then and
        on every later call)."""
        if index in self._unusable:
            return None
        try:
            return self[index]
        except AudioError as exc:
            if not self.skip_bad:
                raise
            self._unusable.add(index)
            self.skipped.append((self.utterances[index].line, str(exc)))
            if len(self._unusable) == len(self.utterances):
                raise ValueError(f"{self.manifest_path}: no utterance has usable audio "
                                 f"(last problem: {exc})") from exc
            return None


def skipped_lines(datasets) -> int:
    """Bad lines the datasets skipped so far (`data/skipped`: train and every eval set)."""
    return sum(len(d.skipped) for d in datasets)


def _optional_manifest(data_cfg: DataConfig, key: str) -> Path | None:
    """`data.<key>` as a path, None when empty; a path that names no file is an error."""
    value = getattr(data_cfg, key)
    if not value:
        return None
    if not Path(value).is_file():
        raise FileNotFoundError(f"data.{key}: {value} does not exist")
    return Path(value)


def resolve_manifests(data_cfg: DataConfig, output_root: str | Path) -> CorpusManifests:
    """The user's manifests when `train/dev/test_manifest` are set (all three are then
    required; `rl_manifest` and `heldout_voices_manifest` are optional), else the
    embedded corpus, built on first use and cached. `rl_manifest` or
    `heldout_voices_manifest` alone replace the embedded corpus' RL prompts or
    held-out-voice split."""
    given = {split: getattr(data_cfg, f"{split}_manifest") for split in ("train", "dev", "test")}
    extra = {name: path for name in ("rl", "heldout_voices")
             if (path := _optional_manifest(data_cfg, f"{name}_manifest")) is not None}
    if uses_embedded_corpus(data_cfg):
        built = build_corpus(data_cfg.corpus, output_root)
        return dataclasses.replace(built, **extra) if extra else built
    missing = [f"data.{split}_manifest" for split, path in given.items() if not path]
    if missing:
        raise ValueError(f"set all of data.train/dev/test_manifest or none; missing: "
                         f"{', '.join(missing)}")
    paths = {split: Path(path) for split, path in given.items()}
    for split, path in paths.items():
        if not path.is_file():
            raise FileNotFoundError(f"data.{split}_manifest: {path} does not exist")
    return CorpusManifests(root=paths["train"].parent, **paths, **extra)
