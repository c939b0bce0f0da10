"""`data.corpus.rl_extra_variants`: the rl split also hears voice variants that neither SFT's
train split nor the held-out split uses; everything else about the corpus stays put."""
import dataclasses

import numpy as np
import pytest

from asr_grpo.config.schema import CorpusConfig
from asr_grpo.data import corpus as corpus_module
from asr_grpo.data.corpus import HELDOUT_SPLIT, RL_EXTRA_VARIANTS, corpus_hash
from asr_grpo.data.espeak import EspeakSynthesizer

# Enough rl utterances that the extra variants show up; planned only.
OFF = CorpusConfig(seed=5, num_train=200, num_dev=40, num_test=40, num_rl=300, num_heldout_voices=60,
                   longform_fraction=0.05, longform_min_s=10.0, longform_max_s=20.0)
ON = dataclasses.replace(OFF, rl_extra_variants=True)


def _variant(voice: str) -> str:
    return voice.partition("+")[2]


def test_only_the_rl_voices_change():
    off, on = corpus_module._plan(OFF), corpus_module._plan(ON)
    assert [s.id for s in off] == [s.id for s in on]
    for a, b in zip(off, on):
        if a.split == "rl":   # the same text, rate, pitch and noise: one voice draw either way
            assert dataclasses.replace(a, voice=b.voice) == b
        else:
            assert a == b
    rl_variants = {_variant(s.voice) for s in on if s.split == "rl"}
    assert len(rl_variants & set(RL_EXTRA_VARIANTS)) >= len(RL_EXTRA_VARIANTS) // 2
    # Voices SFT trained on and voices evaluation holds out never take an extra variant.
    others = {_variant(s.voice) for s in on if s.split != "rl"}
    assert not others & set(RL_EXTRA_VARIANTS)
    heldout = {s.voice for s in on if s.split == HELDOUT_SPLIT}
    assert not heldout & {s.voice for s in on if s.split == "rl"}


def test_off_keeps_the_hash_and_on_changes_it():
    fields = corpus_module._data_fields(OFF)
    assert "rl_extra_variants" not in fields   # corpora built before the key keep their cache
    assert corpus_hash(ON) != corpus_hash(OFF)
    assert corpus_module._data_fields(ON)["rl_extra_variants"] is True


@pytest.mark.parametrize("accent,text", [("en-us", "please turn on the lights in the kitchen"),
                                          ("cmn-latn-pinyin", "请打开客厅的灯")])
def test_every_extra_variant_speaks_audibly(accent, text):
    synth = EspeakSynthesizer()
    for variant in RL_EXTRA_VARIANTS:
        audio = synth.synthesize(text, f"{accent}+{variant}")
        seconds = audio.size / 16000
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
        assert 0.8 < seconds < 6.0 and rms > 0.01, (variant, seconds, rms)
