"""Each reward component on crafted cases, the registry, and the combiner."""
import math

import pytest
import torch

from asr_grpo.config.schema import RewardConfig
from asr_grpo.rewards import (
    DEFAULT_WEIGHTS,
    REWARD_COMPONENTS,
    RewardResult,
    RewardSample,
    cer_score,
    combine,
    keyword_recall,
    language_consistency,
    score_samples,
    smoothness,
)


def test_cer_score():
    assert cer_score("The cat sat.", "the cat sat", "en") == 1.0
    assert cer_score("abcdefghiX", "abcdefghij", "en") == pytest.approx(0.9)
    assert cer_score("我爱北京天门", "我爱北京天安门", "zh") == pytest.approx(6 / 7)
    assert cer_score("abcdefghijklmnop", "ab", "en") == 0.0      # CER 7 clipped
    assert cer_score("", "", "en") == 1.0


def test_keyword_recall():
    assert keyword_recall("the cat sat", ["cat", "dog"], "en") == 0.5
    assert keyword_recall("The CAT sat", ["cat"], "en") == 1.0
    assert keyword_recall("a catalog", ["cat"], "en") == 0.0          # word boundaries
    assert keyword_recall("i love new york city", ["New-York"], "en") == 1.0
    assert keyword_recall("我爱北京", ["北京", "上海"], "zh") == 0.5   # substrings
    assert keyword_recall("我 爱 北 京", ["北京"], "zh") == 1.0
    assert keyword_recall("anything", [], "en") == 1.0                # none to miss
    assert keyword_recall("cat", ["cat", "Cat!", ""], "en") == 1.0    # deduplicated


def test_language_consistency():
    assert language_consistency("hello world", "en") == 1.0
    assert language_consistency("你好世界", "en") == 0.0
    assert language_consistency("你好世界", "zh") == 1.0
    assert language_consistency("hello 你好", "zh") == pytest.approx(2 / 7)
    assert language_consistency("hello world", "en", "English") == 1.0
    assert language_consistency("hello world", "en", "Chinese") == 0.5
    assert language_consistency("你好", "zh", "English") == 0.5
    assert language_consistency("", "en") == 0.0
    assert language_consistency("123 !", "en") == 0.0


def test_language_consistency_for_other_languages():
    # German vs Russian: Latin against Cyrillic letters
    assert language_consistency("Guten Morgen", "de") == 1.0
    assert language_consistency("Доброе утро", "de") == 0.0
    assert language_consistency("Доброе утро", "ru") == 1.0
    assert language_consistency("Guten Morgen", "ru") == 0.0
    assert language_consistency("Привет Anna", "ru") == pytest.approx(6 / 10)
    # Japanese vs English: kanji, kana (ー included) against Latin letters
    assert language_consistency("今日はいい天気です", "ja") == 1.0
    assert language_consistency("コーヒー", "ja") == 1.0
    assert language_consistency("今日はいい天気です", "en") == 0.0
    assert language_consistency("nice weather", "ja") == 0.0
    assert language_consistency("iPhoneを買った", "ja") == pytest.approx(4 / 10)
    # Thai vowel signs are marks, not letters; the letters are all Thai
    assert language_consistency("สวัสดีครับ", "th") == 1.0
    # languages sharing a script differ only by the declared tag
    assert language_consistency("Guten Morgen", "de", "German") == 1.0
    assert language_consistency("Guten Morgen", "de", "English") == 0.5
    assert language_consistency("good morning", "en", "German") == 0.5
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        language_consistency("hello", "xx")


def test_keyword_recall_whole_words_in_spaced_languages_substrings_in_unspaced():
    assert keyword_recall("Ich fahre nach Berlin.", ["Berlin", "Bern"], "de") == 0.5
    assert keyword_recall("Grüsse aus München", ["GRÜSSE"], "de") == 1.0
    assert keyword_recall("明日東京に行きます", ["東京", "大阪"], "ja") == 0.5


def test_smoothness_clean_is_one():
    ref = "thank you for coming today"
    assert smoothness(ref, ref, "en", "stop") == 1.0
    assert smoothness("我爱北京天安门", "我爱北京天安门", "zh") == 1.0
    # repetition the reference itself has is not penalised
    assert smoothness("no no no no", "no no no no", "en") == 1.0


def test_smoothness_penalises_repetition_loops():
    ref = "thank you for coming today and see you next week"
    loop = "thank you for coming today today today today today"   # same length band
    # 9 words -> 7 trigrams, (today, today, today) three times -> 2 repeats
    assert smoothness(loop, ref, "en") == pytest.approx(1 - 2 / 7)
    assert smoothness(loop, ref, "en") < smoothness(ref, ref, "en")
    # zh loop: 8 x 谢 has 6 trigrams, 5 repeats; length ratio 4 decays too
    assert smoothness("谢谢谢谢谢谢谢谢", "谢谢", "zh") == pytest.approx(
        (1 - 5 / 6) * math.exp(-2 * (4 - 1.5)))


def test_smoothness_penalises_hallucinated_length():
    assert smoothness("one two three four", "one two three", "en") == 1.0  # 18/13
    assert smoothness("one two three four five six", "one two three", "en") == \
        pytest.approx(math.exp(-2 * (27 / 13 - 1.5)))


def test_smoothness_penalises_truncation():
    assert smoothness("the cat sat", "the cat sat", "en", "length") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="finish_reason 'abort'"):
        smoothness("a", "a", "en", "abort")


def test_registry_uses_one_signature():
    s = RewardSample(transcript="the cat", reference="the cat sat", language="en",
                     keywords=["cat", "sat"], declared_language="Chinese",
                     finish_reason="length")
    assert set(REWARD_COMPONENTS) == {"cer", "keyword", "language", "smoothness"}
    assert {k: fn(s) for k, fn in REWARD_COMPONENTS.items()} == pytest.approx({
        "cer": 1 - 4 / 11, "keyword": 0.5, "language": 0.5, "smoothness": 0.1})


def test_default_weights_match_config_schema():
    assert DEFAULT_WEIGHTS == RewardConfig().weights


def test_combine_normalises_by_weight_sum():
    comps = {"a": torch.tensor([1.0, 0.0, 1.0]), "b": torch.tensor([0.0, 0.0, 1.0]),
             "logged_only": torch.tensor([0.3, 0.3, 0.3])}
    total = combine(comps, {"a": 1.0, "b": 3.0})
    assert torch.allclose(total, torch.tensor([0.25, 0.0, 1.0]))
    assert total.dtype == torch.float32


def test_combine_rejects_bad_weights():
    comps = {"cer": torch.ones(2), "keyword": torch.ones(2)}
    known = r"unknown components \['kw'\]; known: \['cer', 'keyword'\]"
    with pytest.raises(KeyError, match=known):
        combine(comps, {"cer": 1.0, "kw": 0.5})
    with pytest.raises(ValueError, match="positive sum"):
        combine(comps, {"cer": 0.0})
    with pytest.raises(ValueError, match="positive sum"):
        combine(comps, {"cer": 1.0, "keyword": -0.5})


def test_reward_result_log_and_round_trip():
    r = RewardResult(total=torch.tensor([1.0, 0.5]),
                     components={"cer": torch.tensor([1.0, 0.0])},
                     keep=torch.tensor([True, True]))
    assert r.log() == {"reward/total": 0.75, "reward/cer": 0.5, "reward/dropped": 0.0}
    assert set(r.log(prefix="eval/")) == {"eval/total", "eval/cer", "eval/dropped"}
    back = RewardResult.from_dict(r.to_dict())
    assert torch.equal(back.total, r.total) and torch.equal(back.scores, r.total)
    assert torch.equal(back.components["cer"], r.components["cer"])
    with pytest.raises(ValueError, match=r"'cer' has shape \(3,\), expected \(2,\)"):
        RewardResult(total=torch.zeros(2), components={"cer": torch.zeros(3)})


def test_reward_result_logs_means_per_label_over_kept_samples():
    r = RewardResult(total=torch.tensor([1.0, 0.5, 0.2, 0.0]),
                     components={"cer": torch.tensor([0.8, 0.4, 0.1, 0.9])},
                     keep=torch.tensor([True, True, True, False]))
    log = r.log(labels=["en", "zh", "en", "zh"])
    assert log["reward/total/en"] == pytest.approx(0.6) and log["reward/cer/en"] == pytest.approx(0.45)
    assert log["reward/total/zh"] == 0.5 and log["reward/cer/zh"] == pytest.approx(0.4)   # the dropped one left out
    assert log["reward/total"] == pytest.approx(1.7 / 3) and log["reward/dropped"] == 1.0


def test_score_samples_combines_every_component():
    samples = [RewardSample("the cat sat", "the cat sat", "en", ["cat"]),
               RewardSample("", "the cat sat", "en", ["cat"])]
    r = score_samples(samples, {"cer": 1.0, "keyword": 1.0})
    assert set(r.components) == set(REWARD_COMPONENTS)
    # sample 2: cer 0, keyword 0 -> total 0; language/smoothness logged, not weighted
    assert torch.allclose(r.total, torch.tensor([1.0, 0.0]))
    assert r.components["smoothness"].tolist() == [1.0, 1.0]
