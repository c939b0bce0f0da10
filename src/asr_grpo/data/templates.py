"""Deterministic sentence generators for the synthetic English/Mandarin corpus.

A template mixes literal text, `{slot}` fillers drawn from the vocabulary below and
`[command]` literals. Names, places and commands are keywords: every sentence carries
the keywords that appear verbatim in its text.

Inventory (pinned by tests/data/test_data_templates.py):
- English: 40 names, 48 places, 17 commands, 25 templates; about 4 x 10^6 distinct
  sentences, so a tiny model can't memorise them.
- Mandarin: 24 names, 38 places, 15 commands, 25 templates (about 5 x 10^5 sentences)
  over a deliberately small set of 256 Chinese characters, each checked to be read by
  eSpeak NG's `cmn-latn-pinyin` voice. Characters with several readings are used in
  one reading only (行 only in 银行, 乐 only in 音乐, 了 only as "le", ...).

English text follows LibriSpeech normalisation (lowercase, single spaces, no
punctuation, numbers spelled out); Chinese text is characters only, no spaces.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

LANGUAGES = ("en", "zh")
KEYWORD_SLOTS = frozenset({"name", "place", "city"})
_TOKEN = re.compile(r"\{(\w+)\}|\[([^\]]+)\]")


@dataclass(frozen=True)
class Sentence:
    text: str                   # normalised transcript
    speech: str                 # what eSpeak reads: sentence breaks kept for natural pauses
    keywords: tuple[str, ...]   # names/places/commands found verbatim in `text`
    language: str


# ---------------------------------------------------------------- English vocabulary
_EN_HOURS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
             "ten", "eleven", "twelve"]
_EN_UNITS = _EN_HOURS[:9]
_EN_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
             "seventeen", "eighteen", "nineteen"]


def _en_number(n: int) -> str:
    if n < 10:
        return _EN_UNITS[n - 1]
    if n < 20:
        return _EN_TEENS[n - 10]
    tens = ["twenty", "thirty", "forty", "fifty"][n // 10 - 2]
    return tens if n % 10 == 0 else f"{tens} {_EN_UNITS[n % 10 - 1]}"


EN_SLOTS: dict[str, list[str]] = {
    "name": ["john", "mary", "david", "sarah", "michael", "emma", "james", "olivia",
             "robert", "sophia", "william", "anna", "thomas", "laura", "daniel", "grace",
             "peter", "alice", "henry", "lucy", "george", "hannah", "oliver", "chloe",
             "samuel", "emily", "jack", "kate", "brian", "nina", "victor", "rachel",
             "simon", "helen", "oscar", "julia", "martin", "diana", "kevin", "fiona"],
    "city": ["london", "paris", "berlin", "tokyo", "boston", "chicago", "seattle",
             "madrid", "rome", "sydney", "toronto", "dublin", "vienna", "denver",
             "atlanta", "houston", "new york", "san francisco", "los angeles",
             "hong kong", "amsterdam", "melbourne", "lisbon", "prague"],
    "place": ["the library", "the airport", "the station", "the hospital", "the museum",
              "the office", "the school", "the park", "the bank", "the market",
              "the hotel", "the beach", "the stadium", "the bakery", "the pharmacy",
              "the garden", "the cinema", "the harbor", "the city center", "the gym",
              "the post office", "the bus stop", "the supermarket", "the university"],
    "room": ["kitchen", "bedroom", "living room", "garage", "bathroom", "hallway",
             "study", "basement", "dining room", "guest room"],
    "device": ["lights", "heater", "fan", "television", "radio", "air conditioner",
               "coffee machine", "oven", "speaker", "lamp", "dishwasher", "printer"],
    "object": ["keys", "umbrella", "laptop", "wallet", "phone", "book", "jacket",
               "bag", "camera", "tickets", "glasses", "charger", "notebook", "passport"],
    "items": ["apples", "books", "tickets", "flowers", "candles", "bottles of water",
              "boxes", "pens", "sandwiches", "shirts", "plates", "batteries"],
    "file": ["report", "photos", "slides", "contract", "invoice", "schedule", "notes",
             "budget", "letter", "recipe"],
    "food": ["pizza", "sushi", "noodle", "burger", "coffee", "seafood", "indian",
             "mexican", "thai", "italian", "vegetarian", "chinese"],
    "genre": ["jazz", "rock", "classical", "piano", "country", "folk", "dance",
              "relaxing", "quiet", "happy"],
    "day": ["today", "tomorrow", "tonight", "this morning", "this afternoon",
            "this evening", "next week", "on monday", "on tuesday", "on wednesday",
            "on thursday", "on friday", "on saturday", "on sunday", "next friday",
            "next month", "at noon", "after lunch", "before dinner", "this weekend"],
    "clock": [f"{h}{m}{s}" for h in _EN_HOURS
              for m in ["", " fifteen", " thirty", " forty five"]
              for s in ["", " in the morning", " in the evening"]],
    "count": [_en_number(n) for n in range(2, 13)],
    "number": [_en_number(n) for n in range(1, 60)],
}

EN_TEMPLATES = [
    "please [turn on] the {device} in the {room} at {clock}",
    "[turn off] the {device} in the {room}",
    "[turn off] the {device} at {clock}",
    "{name} is meeting {name} at {place} {day}",
    "[remind] me to [call] {name} {day} at {clock}",
    "[remind] {name} to bring the {object} to {place}",
    "[book] a table for {count} at {place} {day}",
    "[send] a message to {name} saying i will be at {place} {day}",
    "[play] some {genre} music in the {room} for {name}",
    "how long does it take to drive from {place} to {place}",
    "{name} flew from {city} to {city} {day}",
    "[set] an alarm for {clock} {day}",
    "what is the weather like in {city} {day}",
    "[cancel] my meeting with {name} at {place} {day}",
    "[search for] {food} restaurants near {place} in {city}",
    "[call] {name} and tell them the {object} is at {place}",
    "{name} left the {object} at {place}",
    "[open] the {file} that {name} sent me {day}",
    "[schedule] a call with {name} and {name} at {clock}",
    "[navigate to] {place} in {city}",
    "{name} bought {count} {items} at {place} {day}",
    "the train to {city} leaves at {clock}",
    "[check] my calendar for {day} and [call] {name}",
    "[pause] the music and [turn up] the {device} to {number}",
    "[share] the {file} with {name} before {clock}",
]

# --------------------------------------------------------------- Mandarin vocabulary
_ZH_DIGITS = "一二三四五六七八九"


def _zh_number(n: int) -> str:
    if n < 10:
        return _ZH_DIGITS[n - 1]
    tens, units = divmod(n, 10)
    head = "十" if tens == 1 else _ZH_DIGITS[tens - 1] + "十"
    return head + (_ZH_DIGITS[units - 1] if units else "")


def _zh_count(n: int) -> str:
    return "两" if n == 2 else _zh_number(n)   # 两 before a measure word


ZH_SLOTS: dict[str, list[str]] = {
    "name": ["王明", "李华", "张伟", "刘洋", "陈静", "杨帆", "赵雷", "黄丽", "周杰", "吴刚",
             "孙文", "马林", "朱红", "胡兵", "林峰", "何平", "郭强", "罗兰", "宋云", "郑浩",
             "谢芳", "韩梅", "冯军", "许飞"],
    "city": ["北京", "上海", "广州", "深圳", "南京", "杭州", "天津", "西安", "成都", "武汉",
             "苏州", "青岛", "大连", "昆明", "沈阳", "福州"],
    "place": ["图书馆", "火车站", "机场", "医院", "学校", "公园", "超市", "银行", "饭店",
              "办公室", "电影院", "博物馆", "体育馆", "咖啡店", "书店", "酒店", "公司",
              "车站", "市场", "大学", "花园", "海边"],
    "room": ["客厅", "卧室", "厨房", "书房", "阳台", "门口"],
    "device": ["灯", "电视", "窗帘", "电脑", "音响", "风扇", "冰箱", "热水器", "台灯", "门"],
    "media": ["音乐", "新闻", "歌曲", "视频", "电台", "广播"],
    "object": ["手机", "钥匙", "雨伞", "电脑", "书包", "钱包", "衣服", "照片", "车票", "机票"],
    "food": ["米饭", "面条", "饺子", "包子", "水果", "咖啡", "牛奶", "蛋糕", "鸡蛋", "苹果"],
    "message": ["短信", "邮件", "照片", "文件", "消息"],
    "day": ["今天", "明天", "昨天", "后天", "今天上午", "明天下午", "今天晚上", "明天早上",
            "星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期天", "下周",
            "周末", "中午"],
    "clock": [_zh_count(h) + "点" + m for h in range(1, 13)
              for m in ["", "半", "十五分", "二十分", "四十分", "五十分"]],
    "date": [f"{_zh_number(m)}月{_zh_number(d)}号" for m in range(1, 13)
             for d in (1, 3, 5, 8, 10, 12, 15, 18, 20, 21, 25, 28, 30)],
    "count": [_zh_count(n) for n in range(2, 11)],
    "number": [_zh_number(n) for n in range(1, 60)],
}

ZH_TEMPLATES = [
    "请[打开]{room}的{device}",
    "{day}{clock}[关闭]{room}的{device}",
    "{day}{name}要去{place}",
    "{name}在{place}等{name}",
    "[提醒]我{day}{clock}去{place}",
    "[拨打]{name}的电话",
    "给{name}[发送]一条{message}说我{day}到{place}",
    "我想{day}从{city}坐火车去{city}",
    "{city}{day}的天气怎么样",
    "[预订]{date}从{city}到{city}的机票",
    "[取消]我和{name}{day}{clock}的会议",
    "[播放]{room}的{media}",
    "[暂停]{media}",
    "{name}和{name}{day}在{place}开会",
    "[导航]到{city}的{place}",
    "[搜索]{city}{place}附近的{food}",
    "[设置]{day}{clock}的闹钟",
    "{name}买了{count}个{food}",
    "我们{day}{clock}在{place}门口见面",
    "[保存]{name}{day}发给我的{message}",
    "[删除]{name}{day}发的{message}",
    "{name}的{object}在{place}",
    "[查询]{date}从{city}到{city}的火车票",
    "{name}{day}从{city}回来了",
    "把{room}音响的音量改成{number}",
]

_LANGUAGE_TABLES = {"en": (EN_SLOTS, EN_TEMPLATES), "zh": (ZH_SLOTS, ZH_TEMPLATES)}

# eSpeak speech duration at its default 175 wpm, fitted on this corpus: seconds per
# word (en) or character (zh), per sentence break, and a constant (edge silence).
_SECONDS_PER_UNIT = {"en": 0.19, "zh": 0.27}
_SENTENCE_PAUSE_S = {"en": 0.6, "zh": 0.3}
_FIXED_S = {"en": 0.75, "zh": 0.0}
_DEFAULT_RATE_WPM = 175
_TEMPLATE_WEIGHT_CAP = 2000


def _check_language(language: str) -> None:
    if language not in _LANGUAGE_TABLES:
        raise ValueError(f"unknown language {language!r}; expected one of {LANGUAGES}")


def _keyword(language: str, slot: str, value: str) -> str:
    # "the library" -> "library": the article is not part of the name of the place.
    return value.removeprefix("the ") if language == "en" and slot == "place" else value


def _fill(template: str, slots: dict[str, list[str]], language: str,
          rng: np.random.Generator) -> tuple[str, list[str]]:
    parts: list[str] = []
    keywords: list[str] = []
    used: dict[str, set[int]] = {}
    pos = 0
    for match in _TOKEN.finditer(template):
        parts.append(template[pos:match.start()])
        pos = match.end()
        slot, command = match.groups()
        if command is not None:
            parts.append(command)
            keywords.append(command)
            continue
        values = slots[slot]
        taken = used.setdefault(slot, set())
        # A slot used twice ({name} ... {name}) gets two different values.
        choice = int(rng.choice([i for i in range(len(values)) if i not in taken]))
        taken.add(choice)
        parts.append(values[choice])
        if slot in KEYWORD_SLOTS:
            keywords.append(_keyword(language, slot, values[choice]))
    parts.append(template[pos:])
    return "".join(parts), keywords


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@lru_cache(maxsize=None)
def _template_weights(language: str) -> np.ndarray:
    # Templates with few fillings are drawn rarely, so sentences seldom repeat.
    slots, templates = _LANGUAGE_TABLES[language]
    weights = []
    for template in templates:
        names = [m.group(1) for m in _TOKEN.finditer(template) if m.group(1)]
        combos = math.prod(len(slots[n]) - names[:i].count(n) for i, n in enumerate(names))
        weights.append(min(combos, _TEMPLATE_WEIGHT_CAP))
    weights = np.asarray(weights, dtype=np.float64)
    return weights / weights.sum()


def sample_sentence(rng: np.random.Generator, language: str) -> Sentence:
    """One templated sentence (about 1-4 s of speech)."""
    _check_language(language)
    slots, templates = _LANGUAGE_TABLES[language]
    template = templates[int(rng.choice(len(templates), p=_template_weights(language)))]
    text, keywords = _fill(template, slots, language, rng)
    return Sentence(text=text, speech=text, keywords=_unique(keywords), language=language)


def join_sentences(sentences: list[Sentence]) -> Sentence:
    """Long-form utterance: transcripts joined, sentence breaks kept only in `speech`."""
    language = sentences[0].language
    sep, stop = (" ", ". ") if language == "en" else ("", "。")
    return Sentence(
        text=sep.join(s.text for s in sentences),
        speech=stop.join(s.speech for s in sentences),
        keywords=_unique([k for s in sentences for k in s.keywords]),
        language=language,
    )


def estimate_duration_s(sentence: Sentence, rate_wpm: float = _DEFAULT_RATE_WPM) -> float:
    """Rough eSpeak speech duration, used to size long-form utterances."""
    language = sentence.language
    units = len(sentence.text.split()) if language == "en" else len(sentence.text)
    breaks = sentence.speech.count(". " if language == "en" else "。")
    seconds = (units * _SECONDS_PER_UNIT[language] + breaks * _SENTENCE_PAUSE_S[language]
               + _FIXED_S[language])
    return seconds * _DEFAULT_RATE_WPM / rate_wpm


def sample_long(rng: np.random.Generator, language: str, min_s: float = 8.5,
                max_s: float = 14.0, rate_wpm: float = _DEFAULT_RATE_WPM,
                max_tries: int = 20) -> Sentence:
    """Join sentences until the estimated duration lies in [min_s, max_s]."""
    sentences = [sample_sentence(rng, language)]
    tries = 0
    while estimate_duration_s(join_sentences(sentences), rate_wpm) < min_s:
        candidate = sample_sentence(rng, language)
        if estimate_duration_s(join_sentences([*sentences, candidate]), rate_wpm) <= max_s:
            sentences.append(candidate)
        elif (tries := tries + 1) >= max_tries:
            break  # nothing short enough fits; settle just below min_s
    return join_sentences(sentences)


@lru_cache(maxsize=None)
def zh_characters() -> frozenset[str]:
    """Every character a Mandarin sentence can contain."""
    literal = _TOKEN.sub(lambda m: m.group(2) or "", "".join(ZH_TEMPLATES))
    values = "".join(v for vs in ZH_SLOTS.values() for v in vs)
    return frozenset(literal + values)
