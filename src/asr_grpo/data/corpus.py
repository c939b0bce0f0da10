"""The embedded demo corpus: templated English/Mandarin sentences spoken by eSpeak NG.

`build_corpus` is deterministic: the same `CorpusConfig` gives byte-identical manifests
and WAV files, whatever `workers` is. The result is cached under
`<output_root>/corpus/<hash>`; a build goes to a temporary folder that is renamed into
place only when complete, so an interrupted build never looks like a cache hit.

Scripts that call `build_corpus` must guard their entry point with
`if __name__ == "__main__":`, since synthesis runs in freshly started processes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import math
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from tqdm import tqdm

from asr_grpo.config.schema import CorpusConfig
from asr_grpo.data import templates
from asr_grpo.data.espeak import EspeakSynthesizer

log = logging.getLogger(__name__)

# Bump whenever a change here or in templates.py alters the generated data.
GENERATOR_VERSION = "2"   # 2: 5 English accents x 45 voice variants
# "rl": prompts for RL post-training, sentences SFT never saw. An SFT model that has
# memorised its own training set (the default one transcribes it at ~6% CER against
# ~25% on dev) has almost nothing left to learn there. Drawn last, so adding it leaves
# train/dev/test byte-identical.
SPLITS = ("train", "dev", "test", "rl")
# Evaluation split of speakers no other split has (`num_heldout_voices`): the SFT model
# learns the few corpus voices more than speech, and dev shares them. Drawn after every
# split above from its own random stream, so turning it on or off leaves them
# byte-identical; written only when on.
HELDOUT_SPLIT = "heldout_voices"
# rl utterances drawn on the main stream, before the held-out split. The rest of a larger
# rl split follows the held-out split on a stream of its own ([seed, 3]): growing the rl
# split adds prompts and leaves every other split, the held-out one included, byte-identical.
RL_MAIN_STREAM = 2000
METADATA_FILE = "corpus.json"

# The trained speakers: every accent with every variant (45, the plain voice included).
# Many speakers with a dozen utterances each teach speech; a few with hundreds each
# teach those speakers (with 14 voices the SFT model transcribed unseen ones at 1.9x
# its dev CER). eSpeak has one Mandarin voice that reads characters, so Mandarin
# varies by variant, rate and pitch alone.
TRAINED_ACCENTS = {
    "en": ["en-us", "en", "en-gb-x-rp", "en-gb-x-gbclan", "en-029"],
    "zh": ["cmn-latn-pinyin"],
}
TRAINED_VARIANTS = [
    "", "m1", "m2", "m3", "m7", "m8", "f2", "f3", "f4", "klatt2", "klatt3", "klatt4", "klatt5",
    "klatt6", "Andy", "Annie", "Alex", "Alicia", "Lee", "Michael", "adam", "aunty", "benjamin",
    "david", "ed", "edward", "ian", "john", "linda", "max", "norbert", "paul", "quincy", "steph",
    "travis", "zac", "grandma", "grandpa", "gustave", "iven", "michel", "pablo", "shelby",
    "victor", "rob"]


def _voices(accents: dict[str, list[str]], variants: list[str]) -> dict[str, list[str]]:
    """Every accent with every variant ("" is the accent's own voice)."""
    return {language: [f"{accent}+{v}" if v else accent for accent in names for v in variants]
            for language, names in accents.items()}


VOICES = _voices(TRAINED_ACCENTS, TRAINED_VARIANTS)
RATE_WPM = (145, 200)         # inclusive range, eSpeak words per minute
PITCH = (30, 70)              # inclusive range, eSpeak 0-100 scale
# The held-out speakers: accents and variants no VOICES entry has (eSpeak's only other
# Mandarin voice, `cmn`, reads characters as cmn-latn-pinyin does: there the variants,
# rates and pitches make the difference), rates and pitches outside RATE_WPM and PITCH
# on both sides, still intelligible. Each utterance draws one side, then a value in it.
HELDOUT_ACCENTS = {
    "en": ["en-gb-scotland", "en-gb-x-gbcwmd", "en-us-nyc"],
    "zh": ["cmn"],
}
HELDOUT_VARIANTS = ["f1", "f5", "m4", "m5", "m6", "belinda", "robert", "klatt"]
HELDOUT_VOICES = _voices(HELDOUT_ACCENTS, HELDOUT_VARIANTS)
HELDOUT_RATE_WPM = ((120, 138), (208, 230))   # slower, faster
HELDOUT_PITCH = ((12, 24), (76, 90))          # lower, higher
LONG_DURATION_S = (8.5, 14.0)  # target of long-form utterances (estimate; real is 8-15 s)
# Long-form dictation (`longform_fraction`): sentences a spec carries beyond its planned
# count, so the synthesis worker can lengthen one whose real duration fell short.
LONGFORM_SPARES = 4
LONGFORM_MIN_SPAN_S = 5.0     # narrower [min, max] may fit no whole number of sentences
# Options added after corpora were first built, each with the keys it owns: while the gate
# is off (falsy) they stay out of the hash, so older corpora and their SFT checkpoints hold.
_GATED_FIELDS = {
    "longform_fraction": ("longform_fraction", "longform_min_s", "longform_max_s"),
    "num_heldout_voices": ("num_heldout_voices",),
    "rl_extra_variants": ("rl_extra_variants",),
    "train_extra_variants": ("train_extra_variants",),
}
PEAK = 0.9
# Utterances per synthesis task. Each task runs in a fresh process (eSpeak keeps state
# between calls), so output depends on this constant but not on the worker count.
CHUNK_SIZE = 50
_MAX_DRAWS = 1000             # redraws allowed to find a text not used before


@dataclass(frozen=True)
class _Speakers:
    """A split's speaker draws: voices per language, and inclusive ranges of speaking
    rate and pitch (one range is drawn, then a value in it)."""
    voices: dict[str, list[str]]
    rates: tuple[tuple[int, int], ...]
    pitches: tuple[tuple[int, int], ...]


TRAINED_SPEAKERS = _Speakers(VOICES, (RATE_WPM,), (PITCH,))
HELDOUT_SPEAKERS = _Speakers(HELDOUT_VOICES, HELDOUT_RATE_WPM, HELDOUT_PITCH)
# `rl_extra_variants` / `train_extra_variants`: the rl / train split also hears these voice
# variants, which the held-out split never uses, in the trained accents, rates and pitches.
# eSpeak's human-sounding variants only: those that whisper, echo, breathe or voice under 60%
# are left out.
EXTRA_VARIANTS = [
    "Andrea", "AnxiousAndy", "Gene", "Gene2", "Jacky", "Mario", "Mike", "Nguyen", "Storm",
    "Tweaky", "antonio", "boris", "edward2", "iven2", "iven3", "iven4", "kaukovalta", "marcelo",
    "mike2", "pedro", "steph2", "steph3"]
EXTRA_SPEAKERS = _Speakers(_voices(TRAINED_ACCENTS, TRAINED_VARIANTS + EXTRA_VARIANTS),
                           (RATE_WPM,), (PITCH,))
# The splits that can hear EXTRA_VARIANTS, each with the config key that turns them on;
# dev and test keep the trained speakers, so their CER stays comparable either way.
_EXTRA_VARIANT_GATES = {"train": "train_extra_variants", "rl": "rl_extra_variants"}


def _split_speakers(split: str, cfg: CorpusConfig) -> _Speakers:
    """A trained split's speakers. One voice draw an utterance either way, so the extra
    variants change that split's voices only."""
    gate = _EXTRA_VARIANT_GATES.get(split)
    return EXTRA_SPEAKERS if gate and getattr(cfg, gate) else TRAINED_SPEAKERS


@dataclass(frozen=True)
class CorpusManifests:
    root: Path
    train: Path
    dev: Path
    test: Path | None          # read by neither SFT nor RL; None: your own data has none
    rl: Path | None = None     # RL prompts; None: RL draws from train
    heldout_voices: Path | None = None   # evaluation on unseen speakers; None: none

    @property
    def rl_prompts(self) -> Path:
        """The manifest RL draws its prompts from."""
        return self.rl if self.rl is not None else self.train


@dataclass(frozen=True)
class _UtteranceSpec:
    id: str
    split: str
    audio: str                # relative to the corpus root
    text: str
    speech: str
    language: str
    keywords: tuple[str, ...]
    voice: str
    rate_wpm: int
    pitch: int
    snr_db: float
    noise_seed: int
    # Long-form dictation only: candidate sentences, of which the first `longform_count`
    # make the planned text (estimated duration nearest the drawn target); the worker
    # drops or adds sentences until the real duration lies in `duration_range`.
    longform: tuple[templates.Sentence, ...] = ()
    longform_count: int = 0
    duration_range: tuple[float, float] = (0.0, math.inf)


def _data_fields(cfg: Any) -> dict[str, Any]:
    """Config fields that change the generated data: all but `workers`.

    Works for the dataclass and for an OmegaConf node of the same schema. An option of
    `_GATED_FIELDS` that is off leaves its keys out: the hash (and corpus.json) stay those of
    corpora built before the keys existed, so their cache and SFT checkpoints hold."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(CorpusConfig)
              if f.name != "workers"}
    left_out = {key for gate, keys in _GATED_FIELDS.items() if not fields[gate] for key in keys}
    return {k: v for k, v in fields.items() if k not in left_out}


def corpus_hash(cfg: CorpusConfig) -> str:
    """Content hash of the data-relevant config, generator version and eSpeak build."""
    key = {"config": _data_fields(cfg), "generator_version": GENERATOR_VERSION,
           "espeakng_loader": importlib.metadata.version("espeakng-loader")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _splits(cfg: CorpusConfig) -> tuple[str, ...]:
    """The splits a corpus of `cfg` has files for."""
    return SPLITS + (HELDOUT_SPLIT,) if cfg.num_heldout_voices else SPLITS


def _nonempty(path: Path) -> Path | None:
    return path if path.is_file() and path.stat().st_size > 0 else None


def _manifests(root: Path) -> CorpusManifests:
    return CorpusManifests(root, *(root / f"{split}.jsonl" for split in SPLITS[:3]),
                           rl=_nonempty(root / "rl.jsonl"),
                           heldout_voices=_nonempty(root / f"{HELDOUT_SPLIT}.jsonl"))


def _is_complete(root: Path, splits: tuple[str, ...]) -> bool:
    return (root / METADATA_FILE).is_file() and all(
        (root / f"{split}.jsonl").is_file() for split in splits)


def _check_longform(cfg: CorpusConfig) -> None:
    if not 0.0 <= cfg.longform_fraction <= 1.0:
        raise ValueError(f"data.corpus.longform_fraction must lie in [0, 1], got {cfg.longform_fraction}")
    if cfg.longform_fraction > 0 and not (
            0 < cfg.longform_min_s and cfg.longform_max_s - cfg.longform_min_s >= LONGFORM_MIN_SPAN_S):
        raise ValueError(f"data.corpus.longform_min_s ({cfg.longform_min_s}) and longform_max_s "
                         f"({cfg.longform_max_s}) must be positive and at least "
                         f"{LONGFORM_MIN_SPAN_S} s apart")


def _check_heldout(cfg: CorpusConfig) -> None:
    if cfg.num_heldout_voices < 0:
        raise ValueError(f"data.corpus.num_heldout_voices must be >= 0 (0: off), got {cfg.num_heldout_voices}")


def _longform_indices(cfg: CorpusConfig) -> frozenset[int]:
    """The rl utterances that are long-form: exactly round(fraction x num_rl), placed by
    their own generator so that with long-form off the main draws are untouched."""
    count = round(cfg.longform_fraction * cfg.num_rl)
    if count == 0:
        return frozenset()
    picks = np.random.default_rng([cfg.seed, 1]).choice(cfg.num_rl, size=count, replace=False)
    return frozenset(int(i) for i in picks)


def _draw_in(rng: np.random.Generator, ranges: tuple[tuple[int, int], ...]) -> int:
    """An integer in one of the inclusive `ranges`; with a single range, one draw (so
    the trained speakers' draws are those the corpus always made)."""
    low, high = ranges[0] if len(ranges) == 1 else ranges[int(rng.integers(len(ranges)))]
    return int(rng.integers(low, high + 1))


def _spec(rng: np.random.Generator, split: str, index: int, sentence: templates.Sentence,
          rate: int, cfg: CorpusConfig, speakers: _Speakers,
          **longform: Any) -> _UtteranceSpec:
    """The utterance's voice, pitch and noise, drawn after its text."""
    utt_id = f"{split}-{index:05d}"
    language = sentence.language
    voices = speakers.voices[language]
    return _UtteranceSpec(
        id=utt_id, split=split, audio=f"wavs/{split}/{utt_id}.wav",
        text=sentence.text, speech=sentence.speech, language=language,
        keywords=sentence.keywords, voice=voices[int(rng.integers(len(voices)))],
        rate_wpm=rate, pitch=_draw_in(rng, speakers.pitches),
        snr_db=float(rng.uniform(cfg.noise_snr_db_min, cfg.noise_snr_db_max)),
        noise_seed=int(rng.integers(2**63)), **longform,
    )


def _fresh_sentence(rng: np.random.Generator, language: str, used: set[str]) -> templates.Sentence:
    for _ in range(_MAX_DRAWS):
        sentence = templates.sample_sentence(rng, language)
        if sentence.text not in used:
            used.add(sentence.text)
            return sentence
    raise RuntimeError(f"could not draw a new sentence after {_MAX_DRAWS} tries; "
                       "the corpus is too large for the templates")


def _nearest_count(sentences: list[templates.Sentence], target_s: float, rate: int) -> int:
    """How many of `sentences` (the last one overshooting `target_s` by estimate) to join
    for the estimated duration nearest the target."""
    def estimate(n: int) -> float:
        return templates.estimate_duration_s(templates.join_sentences(sentences[:n]), rate)

    n = len(sentences)
    return n - 1 if n > 1 and target_s - estimate(n - 1) < estimate(n) - target_s else n


def _plan_longform(rng: np.random.Generator, index: int, cfg: CorpusConfig,
                   used: set[str], speakers: _Speakers) -> _UtteranceSpec:
    """A dictation of one language: sentences (each new to the corpus, so SFT never saw
    them) joined up to a duration drawn uniformly in [longform_min_s, longform_max_s]."""
    language = "zh" if rng.random() < cfg.zh_fraction else "en"
    rate = _draw_in(rng, speakers.rates)
    target = float(rng.uniform(cfg.longform_min_s, cfg.longform_max_s))
    pool = [_fresh_sentence(rng, language, used)]
    while templates.estimate_duration_s(templates.join_sentences(pool), rate) < target:
        pool.append(_fresh_sentence(rng, language, used))
    count = _nearest_count(pool, target, rate)
    pool += [_fresh_sentence(rng, language, used) for _ in range(LONGFORM_SPARES)]
    return _spec(rng, "rl", index, templates.join_sentences(pool[:count]), rate, cfg, speakers,
                 longform=tuple(pool), longform_count=count,
                 duration_range=(float(cfg.longform_min_s), float(cfg.longform_max_s)))


def _plan_utterance(rng: np.random.Generator, split: str, index: int, cfg: CorpusConfig,
                    used: set[str], speakers: _Speakers) -> _UtteranceSpec:
    """One utterance of a sentence new to the corpus (long-form at `long_fraction`)."""
    for _ in range(_MAX_DRAWS):
        language = "zh" if rng.random() < cfg.zh_fraction else "en"
        rate = _draw_in(rng, speakers.rates)
        if rng.random() < cfg.long_fraction:
            sentence = templates.sample_long(rng, language, *LONG_DURATION_S, rate_wpm=rate)
        else:
            sentence = templates.sample_sentence(rng, language)
        if sentence.text not in used:
            break
    else:
        raise RuntimeError(f"could not draw a new sentence after {_MAX_DRAWS} tries; "
                           "the corpus is too large for the templates")
    used.add(sentence.text)
    return _spec(rng, split, index, sentence, rate, cfg, speakers)


def _plan_heldout(cfg: CorpusConfig, used: set[str]) -> list[_UtteranceSpec]:
    """The held-out-voice split: the other splits' recipe with the held-out speakers, on
    its own random stream (the long-form one is [seed, 1]) and sentences new to the corpus."""
    rng = np.random.default_rng([cfg.seed, 2])
    return [_plan_utterance(rng, HELDOUT_SPLIT, index, cfg, used, HELDOUT_SPEAKERS)
            for index in range(cfg.num_heldout_voices)]


def _plan_rl(rng: np.random.Generator, indices: range, cfg: CorpusConfig, used: set[str],
             longform: frozenset[int]) -> list[_UtteranceSpec]:
    speakers = _split_speakers("rl", cfg)
    return [_plan_longform(rng, index, cfg, used, speakers) if index in longform
            else _plan_utterance(rng, "rl", index, cfg, used, speakers) for index in indices]


def _plan(cfg: CorpusConfig) -> list[_UtteranceSpec]:
    """Draw every utterance's text and voice settings; texts never repeat across splits."""
    _check_longform(cfg)
    _check_heldout(cfg)
    rng = np.random.default_rng(cfg.seed)
    used: set[str] = set()
    specs: list[_UtteranceSpec] = []
    longform = _longform_indices(cfg)
    for split, count in zip(SPLITS[:3], (cfg.num_train, cfg.num_dev, cfg.num_test)):
        speakers = _split_speakers(split, cfg)
        specs += [_plan_utterance(rng, split, index, cfg, used, speakers) for index in range(count)]
    specs += _plan_rl(rng, range(min(cfg.num_rl, RL_MAIN_STREAM)), cfg, used, longform)
    # After the splits above, so they (and the synthesis chunks that hold them) never move.
    specs += _plan_heldout(cfg, used)
    more_rl = range(RL_MAIN_STREAM, cfg.num_rl)
    return specs + _plan_rl(np.random.default_rng([cfg.seed, 3]), more_rl, cfg, used, longform)


def _add_noise(audio: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    power = float(np.mean(audio.astype(np.float64) ** 2)) if audio.size else 0.0
    noise_std = np.sqrt(power / 10 ** (snr_db / 10))
    noise = np.random.default_rng(seed).normal(0.0, noise_std, audio.shape)
    return (audio + noise).astype(np.float32)


def _peak_normalise(audio: np.ndarray) -> np.ndarray:
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    return audio * np.float32(PEAK / peak) if peak > 0 else audio


def _speak(synth: EspeakSynthesizer, spec: _UtteranceSpec, sample_rate: int) -> np.ndarray:
    audio = synth.synthesize(spec.speech, spec.voice, spec.rate_wpm, spec.pitch,
                             sample_rate, seed=spec.noise_seed % 2**31)
    if audio.size == 0:
        raise RuntimeError(f"eSpeak produced no audio for {spec.id}: {spec.speech!r}")
    return audio


def _with_sentences(spec: _UtteranceSpec, count: int) -> _UtteranceSpec:
    joined = templates.join_sentences(list(spec.longform[:count]))
    return dataclasses.replace(spec, text=joined.text, speech=joined.speech,
                               keywords=joined.keywords, longform_count=count)


def _speak_longform(synth: EspeakSynthesizer, spec: _UtteranceSpec,
                    sample_rate: int) -> tuple[_UtteranceSpec, np.ndarray]:
    """Synthesize, then drop or add sentences until the real duration lies in
    `spec.duration_range` (the estimate that planned the count is off by a few %)."""
    low, high = spec.duration_range
    count, last_move = spec.longform_count, 0
    while True:
        spec = _with_sentences(spec, count)
        audio = _speak(synth, spec, sample_rate)
        seconds = len(audio) / sample_rate
        move = -1 if seconds > high else 1 if seconds < low else 0
        if move == 0:
            return spec, audio
        # A reversal means one sentence spans the whole range: no count fits.
        if move == -last_move or not 1 <= count + move <= len(spec.longform):
            raise RuntimeError(f"long-form {spec.id}: {seconds:.1f} s with {count} sentences, "
                               f"no sentence count fits [{low}, {high}] s")
        count, last_move = count + move, move


def _synthesize_chunk(task: tuple[str, int, list[_UtteranceSpec]]) -> list[tuple[_UtteranceSpec, int]]:
    """Runs in a fresh worker process; returns each spec as synthesized (long-form ones
    fitted to their duration range) with the number of samples of its WAV."""
    root, sample_rate, specs = task
    synth = EspeakSynthesizer()
    done = []
    for spec in specs:
        if spec.longform:
            spec, audio = _speak_longform(synth, spec, sample_rate)
        else:
            audio = _speak(synth, spec, sample_rate)
        audio = _peak_normalise(_add_noise(audio, spec.snr_db, spec.noise_seed))
        sf.write(os.path.join(root, spec.audio), audio, sample_rate, subtype="PCM_16")
        done.append((spec, len(audio)))
    return done


def _mp_context() -> mp.context.BaseContext:
    # Never "fork": a forked child would inherit the parent's eSpeak state.
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return mp.get_context("spawn")


def _synthesize_all(specs: list[_UtteranceSpec], root: Path,
                    cfg: CorpusConfig) -> tuple[list[_UtteranceSpec], list[int]]:
    """The specs as synthesized (see `_synthesize_chunk`) and their WAVs' sample counts."""
    chunks = [specs[i:i + CHUNK_SIZE] for i in range(0, len(specs), CHUNK_SIZE)]
    tasks = [(str(root), cfg.sample_rate, chunk) for chunk in chunks]
    done: list[_UtteranceSpec] = []
    frames: list[int] = []
    workers = max(1, min(int(cfg.workers), len(chunks)))
    # maxtasksperchild=1: every chunk starts from a fresh eSpeak state.
    with _mp_context().Pool(workers, maxtasksperchild=1) as pool, \
            tqdm(total=len(specs), desc="synthesizing corpus", unit="utt") as bar:
        for chunk in pool.imap(_synthesize_chunk, tasks):
            done.extend(spec for spec, _ in chunk)
            frames.extend(n for _, n in chunk)
            bar.update(len(chunk))
    return done, frames


def _write_manifests(specs: list[_UtteranceSpec], frames: list[int], root: Path,
                     sample_rate: int, splits: tuple[str, ...]) -> dict[str, Any]:
    """Write one manifest per split; return duration stats per split and language."""
    durations: dict[str, dict[str, list[float]]] = {}
    files = {split: open(root / f"{split}.jsonl", "w", encoding="utf-8") for split in splits}
    try:
        for spec, n in zip(specs, frames, strict=True):
            duration = round(n / sample_rate, 3)
            row = {"id": spec.id, "audio": spec.audio, "text": spec.text,
                   "language": spec.language, "keywords": list(spec.keywords),
                   "duration": duration}
            files[spec.split].write(json.dumps(row, ensure_ascii=False) + "\n")
            durations.setdefault(spec.split, {}).setdefault(spec.language, []).append(duration)
    finally:
        for f in files.values():
            f.close()
    return {split: {language: {
        "utterances": len(d), "total_s": round(sum(d), 1),
        "mean_s": round(float(np.mean(d)), 2), "min_s": min(d), "max_s": max(d),
        "over_8s": sum(x > 8.0 for x in d)} for language, d in sorted(by_language.items())}
        for split, by_language in durations.items()}


def build_corpus(cfg: CorpusConfig, output_root: str | Path) -> CorpusManifests:
    """Synthesize the corpus into `<output_root>/corpus/<hash>`, or reuse a complete one."""
    corpus_dir = Path(output_root) / "corpus"
    digest = corpus_hash(cfg)
    final = corpus_dir / digest
    splits = _splits(cfg)
    if _is_complete(final, splits):
        return _manifests(final)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    if final.exists():  # not produced by this code (our builds appear atomically)
        log.warning("removing incomplete corpus folder %s", final)
        shutil.rmtree(final)

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-tmp-", dir=corpus_dir))
    try:
        specs = _plan(cfg)
        for split in splits:
            (tmp / "wavs" / split).mkdir(parents=True)
        specs, frames = _synthesize_all(specs, tmp, cfg)
        stats = _write_manifests(specs, frames, tmp, cfg.sample_rate, splits)
        metadata = {"hash": digest, "generator_version": GENERATOR_VERSION,
                    "config": _data_fields(cfg), "stats": stats}
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
        try:
            os.replace(tmp, final)
        except OSError:
            if not _is_complete(final, splits):  # another process finished first: use its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built corpus %s (%d utterances) in %.1f s", final, len(specs),
             time.perf_counter() - start)
    return _manifests(final)
