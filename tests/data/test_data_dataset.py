import dataclasses
import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from asr_grpo.config.errors import ConfigError
from asr_grpo.config.schema import DataConfig
from asr_grpo.data import AsrDataset, AudioError, ManifestError, resolve_manifests
from asr_grpo.data import dataset as dataset_module
from asr_grpo.data.corpus import CorpusManifests


@pytest.fixture
def manifest(tmp_path, make_wav):
    make_wav("a.wav", 1.0)
    make_wav("b.wav", 0.5, sr=8000, channels=2)
    rows = [
        {"id": "a", "audio": "a.wav", "text": "turn on the lights", "language": "en",
         "keywords": ["turn on"], "duration": 1.0},
        {"id": "bad", "audio": "missing.wav", "text": "x", "language": "en", "duration": 1.0},
        {"id": "b", "audio": "b.wav", "text": "打开灯", "language": "zh", "duration": 0.5},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


def test_dataset_items_in_skip_mode(manifest):
    ds = AsrDataset(manifest, OmegaConf.structured(DataConfig(on_bad_audio="skip")))
    assert len(ds) == 2 and len(ds.skipped) == 1 and ds.skipped[0][0] == 2
    item = ds[1]
    assert set(item) == {"id", "audio", "text", "language", "keywords", "duration"}
    assert item["audio"].dtype == np.float32 and item["audio"].ndim == 1
    assert len(item["audio"]) == 8000 and item["duration"] == pytest.approx(0.5)  # 8k -> 16k
    assert item["keywords"] == [] and ds[0]["keywords"] == ["turn on"]


def test_dataset_error_mode_fails_at_construction(manifest):
    with pytest.raises(ManifestError, match="line 2"):
        AsrDataset(manifest, DataConfig())


def test_lazy_load_error_names_file_and_line(manifest, tmp_path):
    ds = AsrDataset(manifest, DataConfig(on_bad_audio="skip"))
    (tmp_path / "b.wav").write_bytes(b"overwritten with garbage")
    with pytest.raises(AudioError) as exc:
        ds[1]
    assert "b.wav" in str(exc.value) and "line 3" in str(exc.value)


def test_resolve_user_manifests(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_module, "build_corpus", pytest.fail)
    for split in ("train", "dev", "test"):
        (tmp_path / f"{split}.jsonl").write_text("")
    cfg = DataConfig(**{f"{s}_manifest": str(tmp_path / f"{s}.jsonl")
                        for s in ("train", "dev", "test")})
    got = resolve_manifests(cfg, tmp_path / "out")
    assert got.train == tmp_path / "train.jsonl" and got.test == tmp_path / "test.jsonl"
    assert got.rl_prompts == got.train   # no rl_manifest: RL draws from train
    assert got.heldout_voices is None    # no held-out-voice split unless given one
    (tmp_path / "rl.jsonl").write_text("")
    with_rl = resolve_manifests(dataclasses.replace(cfg, rl_manifest=str(tmp_path / "rl.jsonl")), tmp_path)
    assert with_rl.rl_prompts == tmp_path / "rl.jsonl" and with_rl.train == got.train
    with pytest.raises(ConfigError, match="data.rl_manifest"):
        resolve_manifests(dataclasses.replace(cfg, rl_manifest=str(tmp_path / "nope.jsonl")), tmp_path)
    (tmp_path / "voices.jsonl").write_text("")
    mine = resolve_manifests(dataclasses.replace(cfg, heldout_voices_manifest=str(tmp_path / "voices.jsonl")), tmp_path)
    assert mine.heldout_voices == tmp_path / "voices.jsonl" and mine.dev == got.dev
    with pytest.raises(ConfigError, match="data.heldout_voices_manifest"):
        resolve_manifests(dataclasses.replace(cfg, heldout_voices_manifest="nope.jsonl"), tmp_path)
    # test_manifest is optional (nothing reads it); train and dev are not.
    no_test = resolve_manifests(DataConfig(train_manifest=cfg.train_manifest, dev_manifest=cfg.dev_manifest), tmp_path)
    assert no_test.test is None and no_test.dev == got.dev
    with pytest.raises(ConfigError, match="missing: data.dev_manifest$"):
        resolve_manifests(DataConfig(train_manifest=cfg.train_manifest, test_manifest=cfg.test_manifest), tmp_path)
    with pytest.raises(ConfigError, match="data.dev_manifest: x.jsonl does not exist"):
        resolve_manifests(DataConfig(train_manifest=cfg.train_manifest, dev_manifest="x.jsonl",
                                     test_manifest=cfg.test_manifest), tmp_path)


def test_resolve_builds_embedded_corpus_when_unset(tmp_path, monkeypatch):
    calls = []
    fake = CorpusManifests(tmp_path, tmp_path / "t", tmp_path / "d", tmp_path / "e")
    monkeypatch.setattr(dataset_module, "build_corpus",
                        lambda cfg, root: calls.append((cfg, root)) or fake)
    cfg = DataConfig()
    assert resolve_manifests(cfg, tmp_path) is fake
    assert calls == [(cfg.corpus, tmp_path)]
    # rl_manifest alone swaps the embedded corpus' RL prompts for the user's.
    (tmp_path / "mine.jsonl").write_text("")
    got = resolve_manifests(DataConfig(rl_manifest=str(tmp_path / "mine.jsonl")), tmp_path)
    assert got.rl_prompts == tmp_path / "mine.jsonl" and got.train == fake.train
    # ... and heldout_voices_manifest its held-out-voice split.
    got = resolve_manifests(DataConfig(heldout_voices_manifest=str(tmp_path / "mine.jsonl")), tmp_path)
    assert got.heldout_voices == tmp_path / "mine.jsonl" and got.rl_prompts == fake.rl_prompts
