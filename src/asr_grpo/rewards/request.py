"""A reward request's rows: what each sampled transcript's reward is computed from (its
text, its utterance's reference, language, keywords and duration), in the reward
contract's field names. The experience maker builds them on the driver; a rollout
host's feed (rollout/feed.py) has the reward worker build them, so both send the same."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def utterance_fields(utterance: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a corpus utterance a reward reads (small: it travels with every feed)."""
    return {"text": utterance["text"], "language": utterance["language"],
            "keywords": list(utterance["keywords"]), "duration": float(utterance["duration"])}


def reward_request(responses: Sequence[str], utterances: Sequence[Mapping[str, Any]],
                   seqs: Sequence[Any]) -> dict[str, list]:
    """One row per sequence: its decoded text, its utterance's fields, its finish reason
    (`seqs`: what has a `uid` and a `finish_reason`, a rollout `SequenceResult`)."""
    utts = [utterance_fields(u) for u in utterances]
    return {"queries": list(responses), "prompts": [""] * len(seqs),   # the prompt is audio
            "labels": [u["text"] for u in utts], "responses": list(responses),
            "languages": [u["language"] for u in utts], "keywords": [u["keywords"] for u in utts],
            "durations": [u["duration"] for u in utts],
            "finish_reasons": [s.finish_reason for s in seqs], "sample_ids": [s.uid for s in seqs]}
