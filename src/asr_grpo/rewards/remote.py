"""A reward served over HTTP: the client side of OpenRLHF's remote reward contract.

Each request is `POST <url>` with JSON `{"query": [...], "prompts": [...], "labels": [...],
...this toolkit's extra fields (responses, languages, keywords, finish_reasons, durations,
sample_ids, weights)}`, answered by `{"rewards": [...], "scores": [...], "extra_logs": {...}}`
(docs/rewards.md). The answer goes through the same checks as a local reward file's
(`to_reward_result`, `sanitize`), so a service and a file are interchangeable.

A batch is cut into requests of `batch_size` sequences, sent concurrently (at most
`max_in_flight` at once over all URLs, each to the URL with the fewest in flight). What
a healthy service can fail at and then recover from (connection errors, timeouts, 408,
429, 5xx) is retried with exponential backoff and full jitter, on another URL where
there is one; a 429's Retry-After is honoured. What retrying cannot fix (400, 422 and
other 4xx: the service refused the request itself) is not retried. A request that
finally fails raises `RemoteRewardError` (on_bad="error") or drops its samples
(on_bad="drop": keep=False, counted in reward/dropped): never a reward of 0.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import aiohttp

from asr_grpo.rewards.combine import RewardResult
from asr_grpo.rewards.loader import (
    RewardFunctionError,
    describe_samples,
    is_per_sample,
    sanitize,
    to_reward_result,
)

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
# Batch fields sent as they are: one value per sample (the request's three contract
# fields are renamed: the toolkit's `queries` is OpenRLHF's `query`).
CONTRACT_NAMES = {"queries": "query", "prompts": "prompts", "labels": "labels"}


class RemoteRewardError(RewardFunctionError):
    """A reward request failed for good (refused, or out of retries)."""


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


@dataclass
class RequestLog:
    """What the client saw, for the metrics of a step (`take_stats`)."""
    requests: int = 0
    retries: int = 0
    failed: int = 0
    seconds: list[float] = field(default_factory=list)   # each successful request's round trip

    def as_metrics(self, prefix: str = "reward/remote/") -> dict[str, float]:
        out = {f"{prefix}requests": float(self.requests), f"{prefix}retries": float(self.retries),
               f"{prefix}failed_requests": float(self.failed)}
        if self.seconds:
            s = sorted(self.seconds)
            out[f"{prefix}request_s_p50"] = s[len(s) // 2]
            out[f"{prefix}request_s_max"] = s[-1]
        return out


def backoff_delay(attempt: int, base_s: float, max_s: float, retry_after: float | None = None,
                  rng: random.Random | None = None) -> float:
    """Full jitter (uniform in [0, base·2^attempt], capped): many clients retrying a
    recovering service spread out instead of arriving together. A server's Retry-After
    is a floor (it said when it expects room), still capped at max_s."""
    cap = min(max_s, base_s * 2 ** attempt)
    wait = (rng or random).uniform(0.0, cap)
    if retry_after is not None:
        wait = max(wait, min(max_s, retry_after))
    return wait


def _retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        return float(headers["Retry-After"])
    except (KeyError, ValueError):
        return None


def _nulls_to_nan(value: Any) -> Any:
    """Strict JSON has no NaN: a service sends a non-finite value as null."""
    if isinstance(value, list):
        return [math.nan if v is None else v for v in value]
    if isinstance(value, dict):
        return {k: _nulls_to_nan(v) for k, v in value.items()}
    return value


class RemoteRewardClient:
    """Scores batches on one or several reward services. One client per event loop
    (the Ray reward worker's); its semaphore caps the requests in flight over all calls."""

    def __init__(self, urls: Sequence[str], *, batch_size: int = 32, max_in_flight: int = 8,
                 timeout_s: float = 30.0, retries: int = 5, backoff_s: float = 0.2,
                 backoff_max_s: float = 10.0, on_bad: str = "error", seed: int | None = None):
        if not urls:
            raise ValueError("reward.remote.urls: no URL to send rewards to")
        if batch_size < 1 or max_in_flight < 1 or retries < 0 or timeout_s <= 0:
            raise ValueError("reward.remote: batch_size and max_in_flight must be >= 1, retries >= 0, timeout_s > 0")
        self.urls = list(urls)
        self.batch_size, self.max_in_flight = batch_size, max_in_flight
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.retries, self.backoff_s, self.backoff_max_s = retries, backoff_s, backoff_max_s
        self.on_bad = on_bad
        self.rng = random.Random(seed)
        self.in_flight = {u: 0 for u in self.urls}
        self.stats = RequestLog()
        self._session: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None
        self._turn = 0

    async def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def take_stats(self) -> RequestLog:
        stats, self.stats = self.stats, RequestLog()
        return stats

    def _pick(self, avoid: str | None) -> str:
        """The URL with the fewest requests in flight (round robin among ties), other
        than the one that just failed when there is a choice."""
        choices = [u for u in self.urls if u != avoid] or self.urls
        self._turn += 1
        n = len(choices)
        return min((choices[(self._turn + i) % n] for i in range(n)), key=lambda u: self.in_flight[u])

    async def _post_once(self, session: aiohttp.ClientSession, url: str, body: dict) -> dict:
        self.in_flight[url] += 1
        try:
            async with session.post(url, json=body) as resp:
                text = await resp.text()
                if resp.status in RETRY_STATUS:
                    raise _Retryable(f"HTTP {resp.status} from {url}: {text[:200]}", _retry_after(resp.headers))
                if resp.status != 200:
                    raise RemoteRewardError(f"reward service {url} refused the request: HTTP {resp.status}: "
                                            f"{text[:300]}")
                try:
                    return json.loads(text)
                except json.JSONDecodeError as exc:
                    raise RemoteRewardError(f"reward service {url} answered with invalid JSON: {exc}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__} from {url}: {exc}") from exc
        finally:
            self.in_flight[url] -= 1

    async def _request(self, body: dict, n: int, samples: str) -> RewardResult:
        """One request with its retries; the answer checked like a reward file's output."""
        session = await self._open()
        url, last = None, ""
        async with self._slots:
            for attempt in range(self.retries + 1):
                url = self._pick(avoid=url)
                t0 = time.monotonic()
                self.stats.requests += 1
                try:
                    out = await self._post_once(session, url, body)
                except _Retryable as exc:
                    last = str(exc)
                    if attempt == self.retries:
                        break
                    self.stats.retries += 1
                    wait = backoff_delay(attempt, self.backoff_s, self.backoff_max_s, exc.retry_after, self.rng)
                    log.warning("reward request (%s) failed: %s; retry %d/%d in %.2f s",
                                samples, last, attempt + 1, self.retries, wait)
                    await asyncio.sleep(wait)
                    continue
                self.stats.seconds.append(time.monotonic() - t0)
                if not isinstance(out, dict):
                    raise RemoteRewardError(f"reward service {url}: expected a JSON object, got {type(out).__name__}")
                return to_reward_result(_nulls_to_nan(out), n, f"reward service {url}")
        self.stats.failed += 1
        raise RemoteRewardError(f"reward service unreachable after {self.retries + 1} tries ({samples}): {last}")

    async def score(self, batch: Mapping[str, Any]) -> RewardResult:
        """batch: queries, prompts, labels, optional sample_ids, and any extra fields
        (per-sample lists, or one value for the whole batch such as `weights`)."""
        n = len(batch["queries"])
        ids = list(batch.get("sample_ids") or range(n))
        per_sample = {k: v for k, v in batch.items() if is_per_sample(v, n)}
        shared = {k: v for k, v in batch.items() if k not in per_sample}
        starts = list(range(0, n, self.batch_size))

        async def part(start: int) -> RewardResult:
            rows = slice(start, start + self.batch_size)
            body = {CONTRACT_NAMES.get(k, k): list(v[rows]) for k, v in per_sample.items()}
            body.update(shared)
            size = len(ids[rows])
            samples = describe_samples(ids[rows], size)
            try:
                return await self._request(body, size, samples)
            except RemoteRewardError as exc:
                if self.on_bad == "error":
                    raise
                log.warning("%s: dropping its %s", exc, samples)
                return RewardResult.dropped(size)

        parts = await asyncio.gather(*(part(s) for s in starts))
        result = RewardResult.cat(parts) if parts else RewardResult.dropped(0)
        return sanitize(result, self.on_bad, sample_ids=ids, source="reward service")
