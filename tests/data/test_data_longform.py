"""Long-form dictation in the rl split (`data.corpus.longform_fraction`): off leaves the
corpus exactly as before, on changes only rl, and a 60 s utterance reaches the model whole."""
import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from helpers import noise_audio
from omegaconf import OmegaConf

from asr_grpo.config.schema import CorpusConfig, DataConfig
from asr_grpo.config.store import CONF_DIR
from asr_grpo.data import corpus as corpus_module
from asr_grpo.data.corpus import GENERATOR_VERSION, build_corpus, corpus_hash
from asr_grpo.data.dataset import AsrDataset, max_duration_limit
from asr_grpo.data.templates import join_sentences
from asr_grpo.models import encode_requests
from asr_grpo.models.sequences import FEATURE_CHUNK, encode_prompt, pack_sequences, response_logprobs

# The held-out-voice split and train's extra voice variants off: the corpus as it was before
# they (and long-form) existed.
BASE = CorpusConfig(seed=0, num_train=8, num_dev=3, num_test=3, num_rl=6, num_heldout_voices=0,
                    long_fraction=0.15, workers=2, train_extra_variants=False)
# Every long-form utterance is over the default data.max_duration_s (30 s).
ON = dataclasses.replace(BASE, longform_fraction=0.5, longform_min_s=31.0, longform_max_s=40.0)
# The config fields that existed before long-form: with it off, the hash covers exactly these.
LEGACY_FIELDS = ["seed", "num_train", "num_dev", "num_test", "num_rl", "zh_fraction", "long_fraction",
                 "noise_snr_db_min", "noise_snr_db_max", "sample_rate"]
# Digest of `_plan` for PLAN_CFG: every field that decides an utterance's text and WAV.
# Generator 1 (the code before long-form existed, 14 voices) gave 6262e8c3...; generator 2
# changed only the voice lists, so the same draws with its 270 voices give this one.
PLAN_CFG = CorpusConfig(seed=0, num_train=12, num_dev=4, num_test=4, num_rl=40, num_heldout_voices=0,
                        long_fraction=0.15, train_extra_variants=False)
PLAN_FIELDS = ["id", "split", "audio", "text", "speech", "language", "keywords", "voice", "rate_wpm",
               "pitch", "snr_db", "noise_seed"]
LEGACY_PLAN_DIGEST = "ba42e9b8596d07b6ecdfce5215ea75777fe0a7481f9c0d66e1a7bba0938280e2"


def _digest(root: Path, prefix: str = "") -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).as_posix().startswith(prefix)}


def _rows(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]


def _plan_digest(cfg: CorpusConfig) -> str:
    rows = [[getattr(spec, f) for f in PLAN_FIELDS] for spec in corpus_module._plan(cfg)]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("longform")
    return build_corpus(BASE, root), build_corpus(ON, root)


def test_off_draws_exactly_what_the_code_before_long_form_drew():
    assert _plan_digest(PLAN_CFG) == LEGACY_PLAN_DIGEST
    # min/max are inert while off.
    assert _plan_digest(dataclasses.replace(PLAN_CFG, longform_fraction=0.0, longform_min_s=5.0,
                                            longform_max_s=90.0)) == LEGACY_PLAN_DIGEST


def test_off_keeps_the_hash_of_corpora_built_before_long_form():
    legacy_key = {"config": {k: getattr(BASE, k) for k in LEGACY_FIELDS}, "generator_version": GENERATOR_VERSION,
                  "espeakng_loader": importlib.metadata.version("espeakng-loader")}
    legacy = hashlib.sha256(json.dumps(legacy_key, sort_keys=True).encode()).hexdigest()[:16]
    assert corpus_hash(BASE) == legacy
    assert corpus_hash(dataclasses.replace(BASE, longform_max_s=90.0)) == legacy
    assert corpus_hash(OmegaConf.structured(BASE)) == legacy        # Hydra's form
    assert corpus_hash(ON) != legacy                                 # caches never collide
    assert corpus_hash(ON) != corpus_hash(dataclasses.replace(ON, longform_max_s=45.0))


def test_on_changes_only_the_rl_split(corpora):
    off, on = corpora
    assert on.root != off.root
    for prefix in ("train.", "dev.", "test.", "wavs/train/", "wavs/dev/", "wavs/test/"):
        assert _digest(on.root, prefix) == _digest(off.root, prefix), prefix
    assert _digest(on.root, "rl.") != _digest(off.root, "rl.")
    meta = json.loads((off.root / "corpus.json").read_text("utf-8"))
    assert "longform_fraction" not in meta["config"]                 # corpus.json as before too


def test_rl_holds_the_requested_share_of_long_form_dictation(corpora):
    off, on = corpora
    rows = _rows(on.rl)
    long = [r for r in rows if r["duration"] >= ON.longform_min_s]
    assert len(long) == round(ON.longform_fraction * ON.num_rl) == 3
    assert max(r["duration"] for r in _rows(off.rl)) < ON.longform_min_s
    held_out = {r["text"] for split in (on.train, on.dev, on.test) for r in _rows(split)}
    for row in long:
        assert ON.longform_min_s <= row["duration"] <= ON.longform_max_s
        assert row["keywords"] and all(k in row["text"] for k in row["keywords"])
        assert row["text"] not in held_out
        # Several sentences of one language, joined as a transcript.
        units = len(row["text"].split()) if row["language"] == "en" else len(row["text"])
        assert units > (60 if row["language"] == "en" else 80)
    for split in ("train", "dev", "test"):
        assert max(r["duration"] for r in _rows(getattr(on, split))) < 20.0


def test_loader_admits_long_form_up_to_longform_max_s(corpora):
    _, on = corpora
    ds = AsrDataset(on.rl, DataConfig(corpus=ON))
    assert len(ds) == ON.num_rl and not ds.skipped
    longest = max(range(len(ds)), key=lambda i: ds.utterances[i].duration)
    assert len(ds[longest]["audio"]) > 16000 * DataConfig().max_duration_s
    # The raised limit is only for the embedded corpus with long-form on.
    assert max_duration_limit(DataConfig(corpus=ON)) == ON.longform_max_s
    assert max_duration_limit(DataConfig(corpus=BASE)) == DataConfig().max_duration_s
    assert max_duration_limit(DataConfig(corpus=ON, max_duration_s=90.0)) == 90.0
    mine = DataConfig(corpus=ON, train_manifest="t.jsonl", dev_manifest="d.jsonl", test_manifest="e.jsonl")
    assert max_duration_limit(mine) == DataConfig().max_duration_s


@pytest.mark.parametrize("changes, needle", [
    ({"longform_fraction": 1.5}, "longform_fraction"),
    ({"longform_fraction": 0.3, "longform_min_s": 40.0, "longform_max_s": 42.0}, "longform_min_s"),
])
def test_bad_long_form_settings_fail_naming_the_keys(changes, needle):
    with pytest.raises(ValueError, match=needle):
        corpus_module._plan(dataclasses.replace(BASE, **changes))


def test_demo_yaml_agrees_with_the_schema():
    shipped = OmegaConf.load(Path(CONF_DIR) / "data" / "demo.yaml")
    defaults = CorpusConfig()
    for key in ("longform_fraction", "longform_min_s", "longform_max_s"):
        assert shipped.corpus[key] == getattr(defaults, key), key
    assert (defaults.longform_fraction, defaults.longform_min_s, defaults.longform_max_s) == (0.0, 20.0, 60.0)


def test_longest_long_form_audio_reaches_the_model_whole(tiny_processor, tiny_model):
    """Nothing on the prompt path caps the audio (Qwen3-ASR's feature extractor pads to
    30 s by default, and would cut when asked to truncate)."""
    seconds = CorpusConfig().longform_max_s
    audio = noise_audio(seconds, 0)
    frames = int(seconds * 100)                        # 10 ms mel frames
    audio_tokens = int(seconds) * 13                   # 13 encoder frames per 1 s chunk
    ids, feats = encode_prompt(tiny_processor, audio, "en")
    assert int(feats.mask.sum()) == frames and feats.features.shape[1] == frames // FEATURE_CHUNK * FEATURE_CHUNK
    assert ids.count(tiny_processor.audio_token_id) == audio_tokens
    response = (tiny_processor.tokenizer("call alice at five thirty ")["input_ids"] * 60)[:300]
    batch = pack_sequences([ids], [response], [feats], tiny_processor.tokenizer.pad_token_id)
    with torch.no_grad():
        encoded = tiny_model.get_audio_features(batch.input_features, batch.input_features_mask,
                                                return_dict=True).pooler_output
        logprobs = response_logprobs(tiny_model, batch)
        requests = encode_requests(tiny_processor, [audio], ["en"])
        out = tiny_model.generate(**requests, max_new_tokens=4, do_sample=False)
    assert encoded.shape[0] == audio_tokens
    assert logprobs.shape == (1, 300) and bool(torch.isfinite(logprobs).all())
    assert int(requests["input_features_mask"].sum()) == frames
    assert out.shape[1] > requests["input_ids"].shape[1]


@pytest.mark.parametrize("planned", ["one sentence", "every sentence"])
def test_worker_fits_the_real_duration_whatever_the_estimate_planned(planned):
    """The duration estimate is off by a few %: the worker drops or adds sentences until
    the synthesized audio lies in [longform_min_s, longform_max_s]."""
    from asr_grpo.data.espeak import EspeakSynthesizer

    spec = corpus_module._plan(dataclasses.replace(ON, longform_fraction=1.0, num_rl=1))[-1]
    count = 1 if planned == "one sentence" else len(spec.longform)
    spec = dataclasses.replace(spec, longform_count=count)
    fitted, audio = corpus_module._speak_longform(EspeakSynthesizer(), spec, 16000)
    assert ON.longform_min_s <= len(audio) / 16000 <= ON.longform_max_s
    assert fitted.longform_count != count
    assert fitted.text == join_sentences(list(spec.longform[:fitted.longform_count])).text
