"""The held-out-voice evaluation split (`data.corpus.num_heldout_voices`): speakers no
other split has, drawn last from its own stream; off leaves the corpus exactly as before."""
import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import CorpusConfig
from asr_grpo.data import corpus as corpus_module
from asr_grpo.data import read_manifest
from asr_grpo.data.corpus import (
    GENERATOR_VERSION,
    HELDOUT_SPLIT,
    PITCH,
    RATE_WPM,
    VOICES,
    build_corpus,
    corpus_hash,
)

# Big enough that every trained voice, rate side and pitch side shows up; planned only.
PLAN = CorpusConfig(seed=3, num_train=300, num_dev=60, num_test=60, num_rl=120, num_heldout_voices=200,
                    longform_fraction=0.05, longform_min_s=10.0, longform_max_s=20.0)
# 14 other utterances: the held-out ones share the last synthesis chunk with them.
# train's extra voice variants off: with the split off too, the corpus as it was before it existed.
TINY = CorpusConfig(seed=0, num_train=6, num_dev=3, num_test=3, num_rl=2, num_heldout_voices=5,
                    long_fraction=0.15, workers=2, train_extra_variants=False)
OFF = dataclasses.replace(TINY, num_heldout_voices=0)
OTHER_FILES = ("train.", "dev.", "test.", "rl.", "wavs/train/", "wavs/dev/", "wavs/test/", "wavs/rl/")


def _by_split(specs) -> tuple[list, list]:
    return [s for s in specs if s.split != HELDOUT_SPLIT], [s for s in specs if s.split == HELDOUT_SPLIT]


def _accent_and_variant(voice: str) -> tuple[str, str]:
    accent, _, variant = voice.partition("+")
    return accent, variant


def _digest(root: Path, prefixes: tuple[str, ...]) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).as_posix().startswith(prefixes)}


def _rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("heldout")
    return build_corpus(OFF, root), build_corpus(TINY, root)


def test_speakers_are_disjoint_from_every_other_split():
    others, heldout = _by_split(corpus_module._plan(PLAN))
    assert len(heldout) == PLAN.num_heldout_voices
    for field in ("voice", "rate_wpm", "pitch"):
        assert not {getattr(s, field) for s in heldout} & {getattr(s, field) for s in others}, field
    accents, variants = zip(*(_accent_and_variant(s.voice) for s in others))
    for spec in heldout:
        accent, variant = _accent_and_variant(spec.voice)
        assert accent not in accents and variant not in variants, spec.voice
        assert not RATE_WPM[0] <= spec.rate_wpm <= RATE_WPM[1] and not PITCH[0] <= spec.pitch <= PITCH[1]
    # Both sides of each range are used: slower and faster, lower and higher.
    assert min(s.rate_wpm for s in heldout) < RATE_WPM[0] < RATE_WPM[1] < max(s.rate_wpm for s in heldout)
    assert min(s.pitch for s in heldout) < PITCH[0] < PITCH[1] < max(s.pitch for s in heldout)


def test_held_out_voice_lists_share_no_accent_or_variant_with_the_trained_ones():
    trained_accents, trained_variants = zip(*(_accent_and_variant(v) for vs in VOICES.values() for v in vs))
    assert set(corpus_module.HELDOUT_VOICES) == set(VOICES)   # every language
    for voice in (v for vs in corpus_module.HELDOUT_VOICES.values() for v in vs):
        accent, variant = _accent_and_variant(voice)
        assert accent not in trained_accents and variant not in trained_variants, voice   # "" is trained


def test_texts_are_new_and_the_language_mix_is_the_same():
    others, heldout = _by_split(corpus_module._plan(PLAN))
    texts = [s.text for s in heldout]
    assert len(set(texts)) == len(texts) and not set(texts) & {s.text for s in others}
    assert [s.id for s in heldout] == [f"{HELDOUT_SPLIT}-{i:05d}" for i in range(PLAN.num_heldout_voices)]
    zh_share = sum(s.language == "zh" for s in heldout) / len(heldout)
    assert abs(zh_share - PLAN.zh_fraction) < 0.1
    assert any(s.speech != s.text for s in heldout)   # long (several-sentence) ones too, as elsewhere


def test_plan_is_deterministic_and_leaves_the_other_splits_alone():
    on = corpus_module._plan(PLAN)
    assert on == corpus_module._plan(PLAN)
    off = corpus_module._plan(dataclasses.replace(PLAN, num_heldout_voices=0))
    assert _by_split(on)[0] == off                       # every other split's draws, unmoved
    more = corpus_module._plan(dataclasses.replace(PLAN, num_heldout_voices=250))
    assert _by_split(more)[1][:200] == _by_split(on)[1]   # its own stream: a prefix


def test_off_keeps_the_hash_and_config_of_corpora_built_before_the_split():
    fields = {f.name: getattr(OFF, f.name) for f in dataclasses.fields(CorpusConfig)
              if f.name not in ("workers", "num_heldout_voices", "rl_extra_variants", "train_extra_variants",
                                "longform_fraction", "longform_min_s", "longform_max_s")}
    key = {"config": fields, "generator_version": GENERATOR_VERSION,
           "espeakng_loader": importlib.metadata.version("espeakng-loader")}
    legacy = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    assert corpus_hash(OFF) == corpus_hash(OmegaConf.structured(OFF)) == legacy
    assert corpus_hash(TINY) != legacy                  # caches never collide
    assert corpus_hash(TINY) != corpus_hash(dataclasses.replace(TINY, num_heldout_voices=6))


def test_other_splits_are_byte_identical_on_or_off(corpora):
    off, on = corpora
    assert on.root != off.root
    assert _digest(on.root, OTHER_FILES) == _digest(off.root, OTHER_FILES)
    # Off: no file of the split at all, and corpus.json as before the key existed.
    assert off.heldout_voices is None and not _digest(off.root, (HELDOUT_SPLIT, f"wavs/{HELDOUT_SPLIT}"))
    assert "num_heldout_voices" not in json.loads((off.root / "corpus.json").read_text())["config"]
    assert not (off.root / "wavs" / HELDOUT_SPLIT).exists()
    meta = json.loads((on.root / "corpus.json").read_text())
    assert meta["config"]["num_heldout_voices"] == 5 and HELDOUT_SPLIT in meta["stats"]


def test_the_split_is_built_and_readable(corpora, tmp_path):
    _, on = corpora
    assert on.heldout_voices == on.root / f"{HELDOUT_SPLIT}.jsonl"
    rows = _rows(on.heldout_voices)
    assert [r["id"] for r in rows] == [f"{HELDOUT_SPLIT}-{i:05d}" for i in range(5)]
    assert len(read_manifest(on.heldout_voices).utterances) == 5
    assert all(r["duration"] > 0.5 for r in rows)
    # Another root, worker count and process state: the same bytes.
    again = build_corpus(dataclasses.replace(TINY, workers=1), tmp_path)
    prefixes = (f"{HELDOUT_SPLIT}.", f"wavs/{HELDOUT_SPLIT}/")
    assert _digest(again.root, prefixes) == _digest(on.root, prefixes)


def test_negative_count_fails_naming_the_key():
    with pytest.raises(ValueError, match="num_heldout_voices"):
        corpus_module._plan(dataclasses.replace(TINY, num_heldout_voices=-1))


def test_the_trained_splits_hear_many_speakers_in_each_language():
    """Every trained accent with every trained variant; a few hundred utterances already
    spread over most of them (no handful of speakers to memorise)."""
    assert len(VOICES["en"]) == len(corpus_module.TRAINED_ACCENTS["en"]) * len(corpus_module.TRAINED_VARIANTS)
    assert len(VOICES["zh"]) == len(corpus_module.TRAINED_VARIANTS) >= 40
    others, _ = _by_split(corpus_module._plan(PLAN))
    for language in ("en", "zh"):
        used = {s.voice for s in others if s.language == language}
        utterances = sum(s.language == language for s in others)
        assert len(used) >= min(len(VOICES[language]), utterances) * 0.6, (language, len(used))
