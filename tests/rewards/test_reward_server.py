"""The reward server (asr-grpo-reward-server), over real HTTP on the loopback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch
import uvicorn

from asr_grpo.distributed.net import free_port
from asr_grpo.rewards import call_reward_function, load_reward_function
from asr_grpo.rewards.server import ServerSettings, build_app, main

PROMPT = "<|im_start|>user<|audio_pad|><|im_end|><|im_start|>assistant\n"
RESPONSES = ["language English<asr_text>The cat sat on the mat.",
             "language Chinese<asr_text>我爱北京天门",
             "the the the the"]
BODY = {
    "query": [PROMPT + r for r in RESPONSES],
    "prompts": [PROMPT] * 3,
    "labels": ["the cat sat on the mat", "我爱北京天安门", "the"],
    "responses": RESPONSES,
    "languages": ["en", "zh", "en"],
    "keywords": [["cat"], ["北京", "天安门"], []],
    "finish_reasons": ["stop", "stop", "length"],
    "durations": [1.5, 2.0, 0.7],
    "sample_ids": ["a", "b", 7],
    "weights": {"cer": 1.0, "keyword": 0.5, "language": 0.2, "smoothness": 0.3},
}


@contextmanager
def serve(tmp_path=None, source: str | None = None, **settings):
    """A uvicorn server in a thread on a free loopback port; yields its base URL."""
    if source is not None:
        path = tmp_path / "reward.py"
        path.write_text(textwrap.dedent(source))
        settings["reward_file"] = str(path)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(ServerSettings(**settings)), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def request(url: str, body=None, raw: bytes | None = None, timeout: float = 10):
    """(status, headers, JSON answer) of a POST (body or raw) or, with neither, a GET."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def test_builtin_reward_over_http_equals_the_local_call():
    kwargs = {("queries" if k == "query" else k): v for k, v in BODY.items()}
    local = call_reward_function(load_reward_function(""), **kwargs)
    with serve() as url:
        for path in ("/score", "/get_reward", "/"):
            status, _, out = request(url + path, BODY)
            assert status == 200, out
            torch.testing.assert_close(torch.tensor(out["rewards"]), local.total)
            torch.testing.assert_close(torch.tensor(out["scores"]), local.scores)
            assert out["extra_logs"].keys() == local.components.keys()
            for name, values in out["extra_logs"].items():
                torch.testing.assert_close(torch.tensor(values), local.components[name])


def test_server_weights_apply_only_when_the_request_sends_none():
    only_cer = {"cer": 1.0}
    without = {k: v for k, v in BODY.items() if k != "weights"}
    with serve(weights=only_cer) as url:
        _, _, default = request(url + "/score", without)
        _, _, sent = request(url + "/score", BODY)
    assert default["rewards"] == pytest.approx(default["extra_logs"]["cer"])
    assert sent["rewards"] != pytest.approx(default["rewards"])


def test_a_classic_openrlhf_reward_file_is_served(tmp_path):
    source = """
        import torch

        def reward_func(queries, prompts, labels, **kwargs):
            hits = [float(q.endswith(l)) for q, l in zip(queries, labels)]
            return {"rewards": torch.tensor(hits), "scores": torch.tensor(hits),
                    "extra_logs": {"n_kwargs": torch.full((len(queries),), float(len(kwargs)))}}
    """
    body = {"query": ["p hello", "p world"], "prompts": ["p ", "p "], "labels": ["hello", "x"],
            "durations": [1.0, 2.0]}
    with serve(tmp_path, source) as url:
        status, _, out = request(url + "/get_reward", body)
    assert status == 200
    assert out == {"rewards": [1.0, 0.0], "scores": [1.0, 0.0], "extra_logs": {"n_kwargs": [1.0, 1.0]}}


def test_a_file_without_kwargs_gets_none_of_the_extra_fields(tmp_path):
    source = """
        def reward_func(queries, prompts, labels):
            return [float(len(q)) for q in queries]
    """
    with serve(tmp_path, source) as url:
        status, _, out = request(url + "/score", BODY)
    assert status == 200 and out["rewards"] == [float(len(q)) for q in BODY["query"]]


MALFORMED = {   # one-line reason -> body
    "not JSON": b"{not json",
    "JSON object": b"[1, 2]",
    "missing fields ['prompts']": json.dumps({"query": ["a"], "labels": ["a"]}).encode(),
    "'query' must be a list": json.dumps({"query": "a", "prompts": ["a"], "labels": ["a"]}).encode(),
    "'labels' must be a list with one value per query (3)": json.dumps({**BODY, "labels": ["x"]}).encode(),
    "keywords[1] must be a list of strings": json.dumps({**BODY, "keywords": [["a"], "b", []]}).encode(),
    "'weights' must be a JSON object": json.dumps({**BODY, "weights": [1, 2]}).encode(),
    "reserved": json.dumps({**BODY, "queries": BODY["query"]}).encode(),
}


@pytest.mark.parametrize("reason", MALFORMED)
def test_a_malformed_request_is_400_with_a_one_line_reason(reason):
    with serve() as url:
        status, _, out = request(url + "/score", raw=MALFORMED[reason])
    assert status == 400
    assert reason in out["error"] and "\n" not in out["error"]


def test_a_reward_that_raises_is_422_and_a_broken_contract_too(tmp_path):
    source = """
        def reward_func(queries, prompts, labels, **kwargs):
            if labels[0] == "contract":
                return {"rewards": [1.0]}   # one value for two samples
            raise ValueError("judge says no\\nsecond line")
    """
    body = {"query": ["a", "b"], "prompts": ["", ""], "labels": ["x", "y"], "sample_ids": ["u1", "u2"]}
    with serve(tmp_path, source) as url:
        status, _, out = request(url + "/score", body)
        assert status == 422
        assert "ValueError: judge says no second line" in out["error"] and "u1, u2" in out["error"]
        status, _, out = request(url + "/score", {**body, "labels": ["contract", "y"]})
        assert status == 422 and "'rewards' has shape (1,), expected (2,)" in out["error"]


def test_a_hung_reward_is_504_and_counted_in_health(tmp_path):
    source = """
        import time

        def reward_func(queries, prompts, labels, **kwargs):
            time.sleep(float(labels[0]))
            return {"rewards": [0.0] * len(queries)}
    """
    with serve(tmp_path, source, timeout_s=0.2) as url:
        status, _, out = request(url + "/score", {"query": ["a"], "prompts": [""], "labels": ["1.0"]})
        assert status == 504 and "did not return within 0.2 s" in out["error"]
        assert request(url + "/health")[2]["hung_calls"] >= 1


def test_non_finite_values_go_out_as_null(tmp_path):
    source = """
        import math

        def reward_func(queries, prompts, labels, **kwargs):
            return {"rewards": [1.0, math.nan], "scores": [math.inf, 0.5],
                    "extra_logs": {"judge": [-math.inf, 0.25]}}
    """
    with serve(tmp_path, source) as url:
        status, _, out = request(url + "/score", {"query": ["a", "b"], "prompts": ["", ""], "labels": ["", ""]})
    assert status == 200
    assert out == {"rewards": [1.0, None], "scores": [None, 0.5], "extra_logs": {"judge": [None, 0.25]}}


def test_the_toolkits_client_reads_what_the_server_answers(tmp_path):
    """Both sides of the contract: the built-in reward split over requests equals the
    local call; a NaN sent as null comes back as NaN for on_bad_reward to drop; a 422
    is not retried."""
    import asyncio

    from asr_grpo.rewards.remote import RemoteRewardClient, RemoteRewardError

    batch = {("queries" if k == "query" else k): v for k, v in BODY.items()}
    local = call_reward_function(load_reward_function(""), **batch)

    stats = []

    async def score(url, on_bad, data):
        client = RemoteRewardClient([url + "/score"], batch_size=2, on_bad=on_bad, backoff_s=0.01)
        try:
            return await client.score(data)
        finally:
            await client.close()
            stats.append(client.take_stats())

    with serve() as url:
        served = asyncio.run(score(url, "error", batch))
    assert stats[0].requests == 2   # 3 samples, 2 a request
    torch.testing.assert_close(served.total, local.total)
    torch.testing.assert_close(served.components["cer"], local.components["cer"])

    source = """
        import math

        def reward_func(queries, prompts, labels, **kwargs):
            if "raise" in labels:
                raise ValueError("no")
            return [math.nan if l == "nan" else 1.0 for l in labels]
    """
    three = {"queries": ["a", "b", "c"], "prompts": [""] * 3, "labels": ["x", "nan", "y"]}
    with serve(tmp_path, source) as url:
        dropped = asyncio.run(score(url, "drop", three))
        assert dropped.keep.tolist() == [True, False, True] and dropped.total[0] == 1.0
        with pytest.raises(RemoteRewardError, match="HTTP 422"):
            asyncio.run(score(url, "error", {"queries": ["a"], "prompts": [""], "labels": ["raise"]}))
        assert (stats[-1].requests, stats[-1].retries) == (1, 0)


SLOW = """
    import time

    def reward_func(queries, prompts, labels, **kwargs):
        time.sleep(1.0)
        return {"rewards": [1.0] * len(queries)}
"""
ONE = {"query": ["a"], "prompts": [""], "labels": [""]}


def wait_for(url: str, **counts):
    deadline = time.monotonic() + 5
    while {k: request(url + "/health")[2][k] for k in counts} != counts:
        assert time.monotonic() < deadline, f"health never reached {counts}"
        time.sleep(0.01)


@pytest.mark.parametrize("max_queue", [0, 1])
def test_a_full_queue_is_429_at_once_with_retry_after(tmp_path, max_queue):
    with serve(tmp_path, SLOW, concurrency=1, max_queue=max_queue) as url, ThreadPoolExecutor(2) as pool:
        admitted = [pool.submit(request, url + "/score", ONE) for _ in range(1 + max_queue)]
        wait_for(url, in_flight=1, queued=max_queue)
        t0 = time.monotonic()
        status, headers, out = request(url + "/score", ONE)
        assert status == 429 and time.monotonic() - t0 < 0.9   # not after a call's 1 s
        assert int(headers["Retry-After"]) >= 1 and "busy" in out["error"]
        assert [f.result()[0] for f in admitted] == [200] * (1 + max_queue)
        assert request(url + "/score", ONE)[0] == 200   # room again


def test_health(tmp_path):
    with serve(tmp_path, SLOW, concurrency=2) as url:
        status, _, health = request(url + "/health")
        assert status == 200
        assert health == {"status": "ok", "reward_file": str(tmp_path / "reward.py"), "in_flight": 0,
                          "queued": 0, "hung_calls": health["hung_calls"], "pid": os.getpid()}


@pytest.mark.slow   # three processes, each importing torch: ~10-25 s on a busy 2-core box
def test_two_worker_processes_start_and_answer():
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "asr_grpo.rewards.server", "--port", str(port),
                             "--workers", "2", "--log-level", "info"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                health = request(url + "/health", timeout=1)[2]
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer in 60 s"
                time.sleep(0.2)
        assert health["pid"] != proc.pid   # answered by a worker, not the supervisor
        status, _, out = request(url + "/score", BODY)
        assert status == 200 and len(out["rewards"]) == 3
    finally:
        proc.terminate()
        log = proc.communicate(timeout=20)[0]
    # No worker was taken for hung while it imported (the supervisor's health check).
    assert "died" not in log, log


def test_a_broken_reward_file_fails_before_serving(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("raise ImportError('nope')\n")
    with pytest.raises(SystemExit, match="import failed: ImportError: nope"):
        main(["--reward-file", str(bad), "--port", str(free_port())])
