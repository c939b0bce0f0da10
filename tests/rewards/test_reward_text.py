"""Parsing, normalisation and error rates (the project's evaluation metric code)."""
import pytest

from asr_grpo.rewards import (
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    char_error_rate,
    error_rates_by_language,
    normalize_text,
    split_asr_output,
    utterance_cer,
    word_error_rate,
)
from asr_grpo.rewards.text import words


def test_language_tables_are_inverse():
    assert len(LANGUAGE_NAMES) == 30
    assert LANGUAGE_NAMES["en"] == "English" and LANGUAGE_NAMES["zh"] == "Chinese"
    assert LANGUAGE_NAMES["de"] == "German" and LANGUAGE_NAMES["yue"] == "Cantonese"
    assert LANGUAGE_CODES == {name: code for code, name in LANGUAGE_NAMES.items()}


@pytest.mark.parametrize("response, expected", [
    ("language English<asr_text> the cat sat. ", ("English", "the cat sat.")),
    ("language Chinese<asr_text>我爱北京", ("Chinese", "我爱北京")),
    ("language None<asr_text>", (None, "")),
    ("language None<asr_text> hi", (None, "hi")),
    ("<asr_text>no header", (None, "no header")),
    ("noise language English<asr_text>ok", ("English", "ok")),
    # malformed: no tag -> whole text, minus a leading `language <known name>`
    ("  just a transcript ", (None, "just a transcript")),
    ("language English the cat", (None, "the cat")),
    ("language Chinese我爱", (None, "我爱")),
    ("language is what we speak", (None, "language is what we speak")),
    ("language German<asr_text>Guten Tag", ("German", "Guten Tag")),
    ("language German Guten Tag", (None, "Guten Tag")),
    ("language Japanese<asr_text>こんにちは", ("Japanese", "こんにちは")),
    ("", (None, "")),
])
def test_split_asr_output(response, expected):
    assert split_asr_output(response) == expected


@pytest.mark.parametrize("text, language, expected", [
    ("Hello, World!  It's   FINE.", "en", "hello world its fine"),
    ("well-known \"quotes\" (x) [y] a/b", "en", "well known quotes x y a b"),
    ("ＦＵＬＬ　ｗｉｄｔｈ！", "en", "full width"),
    ("我爱北京，天安门。", "zh", "我爱北京天安门"),
    ("“你好”！ 《世界》、【测试】…", "zh", "你好世界测试"),
    ("我 爱 Hello World ， 你", "zh", "我爱hello world你"),
    ("  ", "en", ""),
])
def test_normalize_text(text, language, expected):
    assert normalize_text(text, language) == expected


def test_unknown_language_is_an_error():
    with pytest.raises(ValueError, match=r"unknown language code 'xx'; known: \['ar', 'cs', "):
        normalize_text("bonjour", "xx")
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        char_error_rate(["a"], ["a"], ["xx"])


@pytest.mark.parametrize("text, language, expected", [
    ("Grüße aus München!", "de", "grüsse aus münchen"),       # ß case-folds to ss
    ("Wie spät ist's?  „Gleich“ – halb drei.", "de", "wie spät ists gleich halb drei"),
    ("Ba\u0308r", "de", "bär"),                                # decomposed umlaut: NFKC composes it
    ("Доброе утро, Мир!", "ru", "доброе утро мир"),
    ("Καλημέρα, κόσμε.", "el", "καλημέρα κόσμε"),
    ("今日は いい 天気 です。", "ja", "今日はいい天気です"),
    ("ｶﾀｶﾅ と iPhone 15 を 買った", "ja", "カタカナとiphone 15を買った"),
    ("สวัสดี ครับ", "th", "สวัสดีครับ"),
    ("我 爱 Hello World ， 你", "yue", "我爱hello world你"),
    ("안녕하세요, 세계!", "ko", "안녕하세요 세계"),                 # Korean separates words
])
def test_normalize_text_other_languages(text, language, expected):
    assert normalize_text(text, language) == expected


def test_german_cer_and_wer_are_on_letters_and_words():
    # umlauts are letters of their own: ü -> u is a substitution, the extra e an insertion
    ref, hyp = "Grüße aus München.", "Grüsse aus Muenchen"
    assert utterance_cer(hyp, ref, "de") == pytest.approx(2 / 18)   # "grüsse aus münchen"
    assert word_error_rate([hyp], [ref], ["de"]) == pytest.approx(1 / 3)
    assert utterance_cer("Bar", "Bär", "de") == pytest.approx(1 / 3)
    assert utterance_cer("WIE SPÄT IST ES", "Wie spät ist es?", "de") == 0.0
    # a missing word boundary is an error, as in English
    assert utterance_cer("Wiespät ist es", "Wie spät ist es", "de") == pytest.approx(1 / 15)


def test_japanese_and_thai_are_counted_by_characters():
    ref_ja = "今日は、いい天気です。"                     # 9 characters once normalised
    assert utterance_cer("今日は いい天気だ", ref_ja, "ja") == pytest.approx(2 / 9)
    # no word boundaries: the "WER" counts the same character units, never 1 of 1 sentence
    assert word_error_rate(["今日はいい天気だ"], [ref_ja], ["ja"]) == pytest.approx(2 / 9)
    assert words("コーヒーをipadで", "ja") == ["コ", "ー", "ヒ", "ー", "を", "ipad", "で"]
    assert word_error_rate(["ipadを買った"], ["iPhoneを買った"], ["ja"]) == pytest.approx(1 / 5)

    ref_th = "สวัสดีครับ"                                  # 10 code points, marks included
    assert words(ref_th, "th") == list(ref_th)
    assert utterance_cer("สวัสดี ครับ", ref_th, "th") == 0.0
    assert utterance_cer("สวัสดีครบ", ref_th, "th") == pytest.approx(1 / 10)
    assert word_error_rate(["สวัสดีครบ"], [ref_th], ["th"]) == pytest.approx(1 / 10)


def test_cer_one_substitution_in_ten_chars():
    assert char_error_rate(["abcdefghiX"], ["abcdefghij"], ["en"]) == pytest.approx(0.1)


def test_cer_ignores_case_and_punctuation_but_counts_spaces():
    assert utterance_cer("The cat, sat!", "the cat sat", "en") == 0.0
    # a missing word boundary is one deleted space out of 11 characters
    assert utterance_cer("thecat sat", "the cat sat", "en") == pytest.approx(1 / 11)


def test_cer_chinese_one_deletion_and_spaces_ignored():
    assert utterance_cer("我爱北京天门", "我爱北京天安门", "zh") == pytest.approx(1 / 7)
    assert utterance_cer("我 爱 北京，天安门", "我爱北京天安门", "zh") == 0.0


def test_cer_can_exceed_one_per_utterance():
    assert utterance_cer("abcdef", "ab", "en") == pytest.approx(2.0)


def test_corpus_cer_and_wer_pool_edits_over_lengths():
    hyps, refs = ["abcdefghiX", "我爱北京天门"], ["abcdefghij", "我爱北京天安门"]
    langs = ["en", "zh"]
    assert char_error_rate(hyps, refs, langs) == pytest.approx(2 / 17)
    # one English word wrong (1/1) + one Chinese character-word deleted (1/7)
    assert word_error_rate(hyps, refs, langs) == pytest.approx(2 / 8)


def test_wer_english_words_and_chinese_mixed_units():
    assert word_error_rate(["the cat sit on mat"], ["the cat sat on the mat"], ["en"]) \
        == pytest.approx(2 / 6)
    # units: 我 用 iphone 手 机 -> one substituted unit of five
    assert word_error_rate(["我用ipad手机"], ["我用iPhone手机"], ["zh"]) == pytest.approx(1 / 5)
    # CER: iphone -> ipad is 4 edits over 10 characters
    assert char_error_rate(["我用ipad手机"], ["我用iPhone手机"], ["zh"]) == pytest.approx(0.4)
    assert word_error_rate(["我用 iPhone 手机"], ["我用iphone手机"], ["zh"]) == 0.0


def test_empty_reference_and_hypothesis():
    assert utterance_cer("", "", "en") == 0.0
    assert utterance_cer("abc", "", "en") == 1.0          # capped, not 3.0
    assert utterance_cer("", "abc", "en") == 1.0          # three deletions / three
    assert char_error_rate([], [], []) == 0.0
    assert char_error_rate(["x", "y"], ["", ""], ["en", "en"]) == 1.0
    # an empty reference adds its insertions but no length to the corpus
    assert char_error_rate(["abc", "abcdefghij"], ["", "abcdefghij"], ["en", "en"]) \
        == pytest.approx(0.3)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in length"):
        char_error_rate(["a"], ["a", "b"], ["en"])


def test_error_rates_by_language():
    hyps = ["abcdefghiX", "the cat sat", "我爱北京天门"]
    refs = ["abcdefghij", "the cat sat", "我爱北京天安门"]
    out = error_rates_by_language(hyps, refs, ["en", "en", "zh"])
    assert out == pytest.approx({
        "cer": 2 / 28, "wer": 2 / 11, "n": 3,
        "cer/en": 1 / 21, "wer/en": 1 / 4, "n/en": 2,
        "cer/zh": 1 / 7, "wer/zh": 1 / 7, "n/zh": 1})
    only_en = error_rates_by_language(["a"], ["a"], ["en"])
    assert "cer/zh" not in only_en and only_en["n/en"] == 1


def test_error_rates_by_language_with_three_languages():
    hyps = ["the cat sit", "Guten Tach", "今日はいい天気だ", "the dog"]
    refs = ["the cat sat", "Guten Tag!", "今日はいい天気です", "the dog"]
    out = error_rates_by_language(hyps, refs, ["en", "de", "ja", "en"])
    # en: 1 of 11 + 7 characters, 1 of 3 + 2 words; de: "tag" -> "tach" 2 of 9 characters,
    # 1 of 2 words; ja: 2 of 9 characters, and 2 of the same 9 units for "WER"
    assert out == pytest.approx({
        "cer": 5 / 36, "wer": 4 / 16, "n": 4,
        "cer/en": 1 / 18, "wer/en": 1 / 5, "n/en": 2,
        "cer/de": 2 / 9, "wer/de": 1 / 2, "n/de": 1,
        "cer/ja": 2 / 9, "wer/ja": 2 / 9, "n/ja": 1})
