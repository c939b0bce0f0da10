"""bench/best_of_n.py: greedy, single-sample and best-of-k CER from the same transcripts,
and k samples per utterance drawn from a real model."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import load_bench_script

from asr_grpo.rewards.text import char_error_rate


def test_best_of_k_takes_the_closest_sample_per_utterance():
    b = load_bench_script("best_of_n")
    refs, langs = ["turn on the light", "打开厨房的灯"], ["en", "zh"]
    greedy = ["turn on the lamp", "打开厨房的灯"]
    samples = [["turn off the lamp", "turn on the light", "turn on a light"],
               ["打开卧室的灯", "打开厨房灯", "打开厨房的门"]]
    out = b.summarize(refs, langs, greedy, samples, ks=[1, 2, 3])
    assert out["greedy"] == pytest.approx(char_error_rate(greedy, refs, langs))
    assert out["best_of_1"] == pytest.approx(char_error_rate([s[0] for s in samples], refs, langs))
    # Best of 2: the exact English sample and the one-deletion Mandarin one.
    assert out["best_of_2"] == pytest.approx(char_error_rate(["turn on the light", "打开厨房灯"], refs, langs))
    assert out["best_of_3"] == out["best_of_2"] < out["best_of_1"]
    assert out["sample_mean"] == pytest.approx(np.mean([char_error_rate([s[j] for s in samples], refs, langs)
                                                        for j in range(3)]))
    assert out["sample_beats_greedy_frac"] == 0.5   # English: a sample beats greedy; Mandarin greedy is exact


def test_samples_come_per_utterance_from_the_model(tiny_model, tiny_processor):
    b = load_bench_script("best_of_n")
    rng = np.random.default_rng(0)
    items = [{"audio": rng.standard_normal(16000 + 4000 * i).astype(np.float32) * 0.1, "language": lang}
             for i, lang in enumerate(["en", "zh", "en"])]
    out = b.sample_transcripts(tiny_model, tiny_processor, items, n=4, temperature=1.0, batch_size=2,
                               max_new_tokens=6)
    assert [len(s) for s in out] == [4, 4, 4]
    assert len({t for s in out for t in s}) > 1   # sampled, not one greedy string repeated
