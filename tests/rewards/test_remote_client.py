"""The HTTP reward client against real services on loopback that are slow, answer 500s
and 429s, refuse a request, or go away and come back: each case ends in a recovery or a
clear error, and a failure is never a reward of 0."""
from __future__ import annotations

import asyncio
import math
import socket
import threading
import time

import pytest
from aiohttp import web

from asr_grpo.rewards.loader import RewardFunctionError
from asr_grpo.rewards.remote import RemoteRewardClient, RemoteRewardError, backoff_delay


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """An aiohttp service in its own thread whose answers follow a script: each entry is
    used by one request ("ok", 500, 429, 422, ("sleep", s), "null"); when the script runs
    out every request is "ok". "ok" scores a query by its length."""

    def __init__(self, script=(), port: int | None = None):
        self.script, self.port = list(script), port or free_port()
        self.seen: list[dict] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append(body)
        what = self.script.pop(0) if self.script else "ok"
        if isinstance(what, tuple):
            await asyncio.sleep(what[1])
            what = "ok"
        if what in (500, 429, 422):
            headers = {"Retry-After": "0.05"} if what == 429 else {}
            return web.json_response({"error": f"scripted {what}"}, status=what, headers=headers)
        rewards = [float(len(q)) for q in body["query"]]
        if what == "null":
            rewards[0] = None
        return web.json_response({"rewards": rewards, "scores": rewards,
                                  "extra_logs": {"length": [float(len(q)) for q in body["query"]]}})

    async def _start(self):
        app = web.Application()
        app.router.add_post("/score", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

    def start(self) -> "Service":
        if not self.thread.is_alive():
            self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/score"


def batch(n: int) -> dict:
    queries = ["a" * (i + 1) for i in range(n)]
    return {"queries": queries, "prompts": [""] * n, "labels": ["x"] * n, "responses": queries,
            "languages": ["en"] * n, "sample_ids": [f"u{i}" for i in range(n)]}


def client(urls, **kw) -> RemoteRewardClient:
    opts = {"batch_size": 4, "max_in_flight": 4, "timeout_s": 2.0, "retries": 4, "backoff_s": 0.01,
            "backoff_max_s": 0.2, "seed": 0, **kw}
    return RemoteRewardClient(urls, **opts)


def score(c: RemoteRewardClient, b: dict):
    async def go():
        try:
            return await c.score(b)
        finally:
            await c.close()
    return asyncio.run(go())


@pytest.fixture
def service():
    made = []

    def make(script=(), port=None):
        s = Service(script, port).start()
        made.append(s)
        return s
    yield make
    for s in made:
        try:
            s.stop()
        except Exception:   # noqa: BLE001 - already stopped by the test
            pass


def test_batches_are_split_and_answers_kept_in_order(service):
    s = service()
    result = score(client([s.url]), batch(10))
    assert result.total.tolist() == [float(i + 1) for i in range(10)]
    assert result.components["length"].tolist() == result.total.tolist()
    assert [len(b["query"]) for b in s.seen] == [4, 4, 2]   # batch_size 4
    assert s.seen[0]["sample_ids"] == ["u0", "u1", "u2", "u3"] and s.seen[0]["languages"] == ["en"] * 4


def test_500s_and_429s_are_retried_until_the_service_answers(service):
    s = service([500, 429, 500])
    c = client([s.url])
    result = score(c, batch(3))
    assert result.total.tolist() == [1.0, 2.0, 3.0]
    assert c.stats.retries == 3 and c.stats.failed == 0


def test_a_slow_answer_times_out_and_is_retried(service):
    s = service([("sleep", 1.5)])
    c = client([s.url], timeout_s=0.5)
    result = score(c, batch(2))
    assert result.total.tolist() == [1.0, 2.0] and c.stats.retries == 1


def test_a_service_that_goes_away_and_comes_back(service):
    port = free_port()
    later = Service(port=port)
    threading.Timer(0.4, later.start).start()   # down at first, up 0.4 s later
    try:
        c = client([f"http://127.0.0.1:{port}/score"], retries=8, backoff_s=0.1, backoff_max_s=0.3)
        result = score(c, batch(2))
        assert result.total.tolist() == [1.0, 2.0] and c.stats.retries >= 1
    finally:
        time.sleep(0.5)
        later.stop()


def test_a_service_that_stays_away_is_an_error_or_a_drop_never_a_zero():
    url = f"http://127.0.0.1:{free_port()}/score"
    with pytest.raises(RemoteRewardError, match="unreachable after 3 tries"):
        score(client([url], retries=2), batch(2))
    dropped = score(client([url], retries=1, on_bad="drop"), batch(3))
    assert dropped.num_dropped == 3 and not dropped.keep.any()


def test_a_refused_request_is_not_retried(service):
    s = service([422])
    c = client([s.url])
    with pytest.raises(RemoteRewardError, match="HTTP 422"):
        score(c, batch(2))
    assert len(s.seen) == 1


def test_load_is_spread_and_a_dead_url_is_routed_around(service):
    a, b = service(), service()
    score(client([a.url, b.url], batch_size=1), batch(8))
    assert len(a.seen) > 0 and len(b.seen) > 0 and len(a.seen) + len(b.seen) == 8
    dead = f"http://127.0.0.1:{free_port()}/score"
    result = score(client([dead, a.url], batch_size=2), batch(6))
    assert result.total.tolist() == [float(i + 1) for i in range(6)]


def test_a_null_reward_follows_the_bad_reward_policy(service):
    s = service(["null"])
    with pytest.raises(RewardFunctionError, match="non-finite"):
        score(client([s.url]), batch(2))
    s.script = ["null"]
    result = score(client([s.url], on_bad="drop"), batch(2))
    assert result.keep.tolist() == [False, True] and math.isfinite(float(result.total[0]))


def test_backoff_grows_with_full_jitter_and_honours_retry_after():
    import random
    rng = random.Random(0)
    waits = [backoff_delay(a, 0.1, 10.0, rng=rng) for a in range(6) for _ in range(50)]
    assert all(0 <= w <= 0.1 * 2 ** 5 for w in waits)
    assert max(waits[250:]) > max(waits[:50])            # later retries may wait longer
    assert backoff_delay(0, 0.1, 10.0, retry_after=2.0, rng=rng) >= 2.0
    assert backoff_delay(0, 0.1, 1.0, retry_after=30.0, rng=rng) == 1.0   # capped
