"""Torch dataset over a validated manifest, and where the manifests come from."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from asr_grpo.config.errors import ConfigError
from asr_grpo.config.schema import DataConfig
from asr_grpo.data.audio import AudioError, load_audio
from asr_grpo.data.corpus import CorpusManifests, build_corpus
from asr_grpo.data.manifest import ManifestError, Utterance, read_manifest


def uses_embedded_corpus(data_cfg: DataConfig) -> bool:
    # test_manifest counts too: set alone, the run names the manifests it misses rather
    # than going on silently on the embedded corpus.
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
    """Utterances of one manifest, the `split` named in errors ("train", "dev", ...);
    audio is loaded lazily as float32 mono at `data_cfg.sample_rate`.

    Lines are validated when the dataset is built (`data_cfg.on_bad_audio`: "error"
    raises, "skip" drops them and lists `(line, reason)` in `skipped`). A manifest left
    with no utterance is a `ManifestError` naming it and the split: an empty dev set
    would score a CER of 0, an empty prompt set would train on nothing. Problems only the
    samples show (silence, NaN, a file that stopped decoding) surface on loading:
    `item[i]` raises `AudioError` naming the file and manifest line in both modes;
    `load(i)` follows the policy (raises, or returns None and adds the line to
    `skipped`, which so counts both kinds).
    """

    def __init__(self, manifest_path: str | Path, data_cfg: DataConfig, split: str = "") -> None:
        self.manifest_path = Path(manifest_path)
        self.split = split
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
        if not self.utterances:
            raise ManifestError(self.manifest_path, None, self._no_utterance(result.skipped))

    def _named(self) -> str:
        return f"the {self.split} split" if self.split else "the manifest"

    def _no_utterance(self, skipped: list[tuple[int, str]]) -> str:
        if not skipped:
            return f"{self._named()} has no utterances (an empty manifest)"
        line, reason = skipped[0]
        return (f"{self._named()} has no usable utterance: data.on_bad_audio=skip skipped all "
                f"{len(skipped)} lines (line {line}: {reason})")

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
                raise ManifestError(self.manifest_path, None, f"no utterance has usable audio "
                                                              f"({self._named()}; last problem: {exc})") from exc
            return None


def load_first(dataset, n: int) -> list[dict]:
    """The first `n` utterances of `dataset` (all, if it has fewer) that load under the
    bad-audio policy (`AsrDataset.load`; another dataset's items all count)."""
    load = getattr(dataset, "load", dataset.__getitem__)
    return [it for it in map(load, range(min(len(dataset), n))) if it is not None]


def skipped_lines(datasets) -> int:
    """Bad lines the datasets skipped so far (`data/skipped`: train and every eval set)."""
    return sum(len(d.skipped) for d in datasets)


def _manifest_file(data_cfg: DataConfig, key: str) -> Path | None:
    """`data.<key>` as a path, None when empty; a path that names no file is a ConfigError."""
    value = getattr(data_cfg, key)
    if not value:
        return None
    if not Path(value).is_file():
        raise ConfigError(f"data.{key}: {value} does not exist")
    return Path(value)


def resolve_manifests(data_cfg: DataConfig, output_root: str | Path) -> CorpusManifests:
    """The user's manifests when `train/dev_manifest` are set (both are then required;
    `rl_manifest` and `heldout_voices_manifest` are optional), else the embedded corpus,
    built on first use and cached. `rl_manifest` or `heldout_voices_manifest` alone
    replace the embedded corpus' RL prompts or held-out-voice split. `test_manifest` is
    optional and never read: SFT and RL evaluate on dev (and the held-out voices); the
    path is passed on as given, for the user's own final evaluation."""
    extra = {name: path for name in ("rl", "heldout_voices")
             if (path := _manifest_file(data_cfg, f"{name}_manifest")) is not None}
    if uses_embedded_corpus(data_cfg):
        built = build_corpus(data_cfg.corpus, output_root)
        return dataclasses.replace(built, **extra) if extra else built
    missing = [f"data.{split}_manifest" for split in ("train", "dev")
               if not getattr(data_cfg, f"{split}_manifest")]
    if missing:
        raise ConfigError(f"your own data needs data.train_manifest and data.dev_manifest "
                          f"(data.test_manifest is optional); missing: {', '.join(missing)}")
    paths = {split: _manifest_file(data_cfg, f"{split}_manifest") for split in ("train", "dev")}
    test = Path(data_cfg.test_manifest) if data_cfg.test_manifest else None
    return CorpusManifests(root=paths["train"].parent, test=test, **paths, **extra)
