import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf
from omegaconf import OmegaConf

from asr_grpo.config.schema import CorpusConfig
from asr_grpo.data import corpus as corpus_module
from asr_grpo.data import read_manifest
from asr_grpo.data.corpus import HELDOUT_SPLIT, SPLITS, build_corpus, corpus_hash

# Long-form share raised so the tiny corpus contains long utterances too.
TINY = CorpusConfig(seed=0, num_train=12, num_dev=4, num_test=4, num_rl=4, num_heldout_voices=4,
                    long_fraction=0.15, workers=2)
ALL_SPLITS = (*SPLITS, HELDOUT_SPLIT)
FIELDS = ["id", "audio", "text", "language", "keywords", "duration"]


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]


def _build_in_subprocess(cfg: CorpusConfig, output_root: Path) -> Path:
    # A separate interpreter, started later: catches state or clock-seeded randomness
    # shared by builds in one process.
    code = ("import sys, json; from asr_grpo.config.schema import CorpusConfig; "
            "from asr_grpo.data import build_corpus; "
            "print(build_corpus(CorpusConfig(**json.loads(sys.argv[1])), sys.argv[2]).root)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(dataclasses.asdict(cfg)),
                          str(output_root)], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    a = build_corpus(TINY, tmp_path_factory.mktemp("a"))
    # Another root, process and worker count: output must not depend on any of them.
    b_root = _build_in_subprocess(dataclasses.replace(TINY, workers=1),
                                  tmp_path_factory.mktemp("b"))
    return a, corpus_module._manifests(b_root)


def test_same_config_gives_identical_files(built):
    a, b = built
    digest_a = _digest(a.root)
    assert len([k for k in digest_a if k.endswith(".wav")]) == 28
    assert digest_a == _digest(b.root)
    assert a.root.name == b.root.name == corpus_hash(TINY)


def test_other_seed_gives_other_corpus(built, tmp_path):
    other = build_corpus(dataclasses.replace(TINY, seed=1), tmp_path)
    assert other.root.name != built[0].root.name
    assert _rows(other.train) != _rows(built[0].train)


def test_cache_hit_does_not_rebuild(built, monkeypatch):
    a, _ = built
    mtimes = {p: p.stat().st_mtime_ns for p in a.root.rglob("*")}
    monkeypatch.setattr(corpus_module, "_synthesize_all", pytest.fail)
    again = build_corpus(dataclasses.replace(TINY, workers=7), a.root.parent.parent)
    assert again == a
    assert {p: p.stat().st_mtime_ns for p in a.root.rglob("*")} == mtimes


def test_interrupted_build_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    def boom(*args):
        raise KeyboardInterrupt

    cfg = dataclasses.replace(TINY, num_train=2, num_dev=1, num_test=1)
    monkeypatch.setattr(corpus_module, "_write_manifests", boom)
    with pytest.raises(KeyboardInterrupt):
        build_corpus(cfg, tmp_path)
    assert list((tmp_path / "corpus").iterdir()) == []   # temp folder removed too
    monkeypatch.undo()
    assert build_corpus(cfg, tmp_path).train.is_file()


def test_manifests_are_valid(built):
    a, _ = built
    rows = {split: _rows(getattr(a, split)) for split in ALL_SPLITS}
    assert [len(rows[s]) for s in ALL_SPLITS] == [12, 4, 4, 4, 4]
    everything = [r for split_rows in rows.values() for r in split_rows]
    assert {r["language"] for r in everything} == {"en", "zh"}
    assert max(r["duration"] for r in everything) > 8.0          # long-form present
    for row in everything:
        assert list(row) == FIELDS
        assert all(k in row["text"] for k in row["keywords"])
        info = sf.info(str(a.root / row["audio"]))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert row["duration"] == round(info.frames / 16000, 3)
    train_texts = {r["text"] for r in rows["train"]}
    held_out = [r["text"] for r in rows["dev"] + rows["test"] + rows["rl"] + rows[HELDOUT_SPLIT]]
    assert not train_texts & set(held_out) and len(set(held_out)) == len(held_out)
    # The project's own reader accepts every line.
    for split in ALL_SPLITS:
        assert len(read_manifest(getattr(a, split)).utterances) == len(rows[split])


def test_hash_ignores_workers_only():
    assert corpus_hash(TINY) == corpus_hash(dataclasses.replace(TINY, workers=5))
    assert corpus_hash(TINY) == corpus_hash(OmegaConf.structured(TINY))   # Hydra's form
    assert corpus_hash(TINY) != corpus_hash(dataclasses.replace(TINY, noise_snr_db_min=20.0))


def test_rl_split_leaves_the_other_splits_unchanged(built, tmp_path):
    """The rl split is drawn last: a corpus without it has byte-identical train/dev/test
    (so an SFT checkpoint stays valid), and RL prompts default to train there."""
    without = build_corpus(dataclasses.replace(TINY, num_rl=0), tmp_path)
    with_rl = built[0]
    assert without.rl is None and without.rl_prompts == without.train
    assert with_rl.rl_prompts == with_rl.rl == with_rl.root / "rl.jsonl"
    # heldout_voices comes after rl (its texts avoid rl's, its audio follows rl's in a
    # synthesis process): it may change with it.
    after = ("rl.", "wavs/rl/", "corpus.", f"{HELDOUT_SPLIT}.", f"wavs/{HELDOUT_SPLIT}/")
    same = {k: v for k, v in _digest(with_rl.root).items() if not k.startswith(after)}
    assert same == {k: v for k, v in _digest(without.root).items() if not k.startswith(after)}
    assert [r["id"] for r in _rows(with_rl.rl)] == [f"rl-{i:05d}" for i in range(4)]


def test_a_larger_rl_split_adds_prompts_and_moves_nothing(tmp_path, monkeypatch):
    """rl utterances past RL_MAIN_STREAM come after the held-out split, from a stream of
    their own: every file of the smaller corpus, held-out voices included, is unchanged
    and its rl split is a prefix of the larger one's."""
    monkeypatch.setattr(corpus_module, "RL_MAIN_STREAM", 2)
    small = build_corpus(TINY, tmp_path / "small")
    large = build_corpus(dataclasses.replace(TINY, num_rl=9), tmp_path / "large")
    small_files, large_files = _digest(small.root), _digest(large.root)
    grown = {"rl.jsonl", "corpus.json"}
    assert {k: v for k, v in small_files.items() if k not in grown} == \
        {k: v for k, v in large_files.items() if k in small_files and k not in grown}
    small_rl, large_rl = _rows(small.rl), _rows(large.rl)
    assert large_rl[:len(small_rl)] == small_rl
    assert [r["id"] for r in large_rl] == [f"rl-{i:05d}" for i in range(9)]
    texts = [r["text"] for split in ALL_SPLITS for r in _rows(large.root / f"{split}.jsonl")]
    assert len(set(texts)) == len(texts)   # the added prompts are sentences no split has
