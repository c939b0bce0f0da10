import re

import numpy as np
import pytest

from asr_grpo.data import templates

EN_TEXT = re.compile(r"[a-z]+( [a-z]+)*")
ZH_TEXT = re.compile(r"[\u4e00-\u9fff]+")


def _sample(language, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return [templates.sample_sentence(rng, language) for _ in range(n)]


@pytest.mark.parametrize("language", templates.LANGUAGES)
def test_sentences_rarely_repeat(language):
    sentences = _sample(language)
    assert len({s.text for s in sentences}) / len(sentences) > 0.95


@pytest.mark.parametrize("language", templates.LANGUAGES)
def test_deterministic_per_seed(language):
    assert _sample(language, 50, seed=3) == _sample(language, 50, seed=3)
    assert _sample(language, 50, seed=3) != _sample(language, 50, seed=4)


def _keyword_in_text(keyword, sentence):
    if sentence.language == "zh":
        return keyword in sentence.text
    return f" {keyword} " in f" {sentence.text} "   # whole words


@pytest.mark.parametrize("language", templates.LANGUAGES)
def test_text_format_and_keywords(language):
    rng = np.random.default_rng(1)
    sentences = _sample(language, 500) + [
        templates.sample_long(rng, language) for _ in range(50)]
    pattern = EN_TEXT if language == "en" else ZH_TEXT
    with_keywords = 0
    for s in sentences:
        assert pattern.fullmatch(s.text), s.text
        assert len(set(s.keywords)) == len(s.keywords)
        assert all(_keyword_in_text(k, s) for k in s.keywords), s
        with_keywords += bool(s.keywords)
    assert with_keywords / len(sentences) > 0.9


def test_keywords_are_names_places_and_commands():
    s = templates.sample_sentence(np.random.default_rng(0), "en")
    vocabulary = set(templates.EN_SLOTS["name"]) | set(templates.EN_SLOTS["city"]) | {
        p.removeprefix("the ") for p in templates.EN_SLOTS["place"]}
    commands = {c for t in templates.EN_TEMPLATES for c in re.findall(r"\[([^\]]+)\]", t)}
    assert set(s.keywords) <= vocabulary | commands


def test_chinese_inventory_is_small_and_covers_text():
    inventory = templates.zh_characters()
    assert 250 <= len(inventory) <= 400
    assert all(ZH_TEXT.fullmatch(c) for c in inventory)
    used = set("".join(s.text for s in _sample("zh", 3000)))
    assert used <= inventory
    assert len(used) > 0.95 * len(inventory)   # no dead vocabulary


@pytest.mark.parametrize("language", templates.LANGUAGES)
def test_long_form_joins_sentences(language):
    rng = np.random.default_rng(2)
    for _ in range(20):
        s = templates.sample_long(rng, language, min_s=8.5, max_s=14.0)
        assert 8.5 <= templates.estimate_duration_s(s) <= 14.0
        assert (". " if language == "en" else "。") in s.speech
        assert not re.search(r"[.。]", s.text)


def test_unknown_language():
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        templates.sample_sentence(np.random.default_rng(0), "fr")
