"""The SFT tokenizer on other languages: every script round-trips; the unspaced scripts
(Chinese characters, kana, Thai) are split per character, spaced ones merge in words."""
import pytest

from asr_grpo.models.tokenizer import train_tokenizer

TEXTS = {
    "de": "Grüße aus München, wie spät ist es?",
    "ru": "Доброе утро, как дела?",
    "el": "Καλημέρα κόσμε",
    "ar": "صباح الخير",
    "hi": "नमस्ते दुनिया",
    "ko": "안녕하세요 세계",
    "ja": "今日はいい天気ですね、コーヒーを飲みます",
    "th": "สวัสดีครับ วันนี้อากาศดี",
    "zh": "我爱北京天安门",
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(list(TEXTS.values()) * 20, vocab_size=600, languages=list(TEXTS))


@pytest.mark.parametrize("code", list(TEXTS))
def test_every_script_round_trips(tokenizer, code):
    text = TEXTS[code] + " unseen ÆØÅ ñ"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.parametrize("text", ["コーヒーを飲みます", "สวัสดีครับ"])
def test_kana_and_thai_are_one_character_per_piece(tokenizer, text):
    pieces = [tokenizer.decode([i]) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert pieces == list(text)


def test_spaced_scripts_merge_within_words_and_prompts_are_compact(tokenizer):
    assert len(tokenizer("München", add_special_tokens=False)["input_ids"]) < len("München")
    assert len(tokenizer("language German", add_special_tokens=False)["input_ids"]) == 2
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        train_tokenizer(["a"], vocab_size=300, languages=["xx"])
