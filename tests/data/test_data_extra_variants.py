"""`data.corpus.rl_extra_variants` / `train_extra_variants`: the rl / train split also hears
voice variants that the held-out split never uses; everything else about the corpus stays put."""
import dataclasses

import numpy as np
import pytest

from asr_grpo.config.schema import CorpusConfig
from asr_grpo.data import corpus as corpus_module
from asr_grpo.data.corpus import EXTRA_VARIANTS, HELDOUT_SPLIT, corpus_hash
from asr_grpo.data.espeak import EspeakSynthesizer

# Enough rl and train utterances that the extra variants show up; planned only. Both gates off
# (train's is on by default).
OFF = CorpusConfig(seed=5, num_train=300, num_dev=40, num_test=40, num_rl=300, num_heldout_voices=60,
                   longform_fraction=0.05, longform_min_s=10.0, longform_max_s=20.0,
                   rl_extra_variants=False, train_extra_variants=False)
GATES = {"rl": "rl_extra_variants", "train": "train_extra_variants"}


def _variant(voice: str) -> str:
    return voice.partition("+")[2]


@pytest.mark.parametrize("split", sorted(GATES))
def test_only_the_gated_splits_voices_change(split):
    on_cfg = dataclasses.replace(OFF, **{GATES[split]: True})
    off, on = corpus_module._plan(OFF), corpus_module._plan(on_cfg)
    assert [s.id for s in off] == [s.id for s in on]
    for a, b in zip(off, on):
        if a.split == split:   # the same text, rate, pitch and noise: one voice draw either way
            assert dataclasses.replace(a, voice=b.voice) == b
        else:
            assert a == b
    variants = {_variant(s.voice) for s in on if s.split == split}
    assert len(variants & set(EXTRA_VARIANTS)) >= len(EXTRA_VARIANTS) // 2
    # The other splits (dev and the held-out voices included) never take an extra variant.
    others = {_variant(s.voice) for s in on if s.split != split}
    assert not others & set(EXTRA_VARIANTS)
    heldout = {s.voice for s in on if s.split == HELDOUT_SPLIT}
    assert not heldout & {s.voice for s in on if s.split == split}


@pytest.mark.parametrize("gate", sorted(GATES.values()))
def test_off_keeps_the_hash_and_on_changes_it(gate):
    assert gate not in corpus_module._data_fields(OFF)   # corpora built before the key keep their cache
    on_cfg = dataclasses.replace(OFF, **{gate: True})
    assert corpus_hash(on_cfg) != corpus_hash(OFF)
    assert corpus_module._data_fields(on_cfg)[gate] is True


def test_both_gates_give_a_corpus_of_its_own():
    both = dataclasses.replace(OFF, rl_extra_variants=True, train_extra_variants=True)
    hashes = {corpus_hash(c) for c in (OFF, both, dataclasses.replace(OFF, rl_extra_variants=True),
                                       dataclasses.replace(OFF, train_extra_variants=True))}
    assert len(hashes) == 4


@pytest.mark.parametrize("accent,text", [("en-us", "please turn on the lights in the kitchen"),
                                          ("cmn-latn-pinyin", "请打开客厅的灯")])
def test_every_extra_variant_speaks_audibly(accent, text):
    synth = EspeakSynthesizer()
    for variant in EXTRA_VARIANTS:
        audio = synth.synthesize(text, f"{accent}+{variant}")
        seconds = audio.size / 16000
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
        assert 0.8 < seconds < 6.0 and rms > 0.01, (variant, seconds, rms)
