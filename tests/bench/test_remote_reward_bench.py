"""bench/remote_reward.py's parts: the delaying proxy adds its latency to every exchange
(and no more than a little on top), the judge holds a sequence for its service time and
scores it with the built-in reward, and the ideal is what a perfect pipeline could hide."""
from __future__ import annotations

import socket
import threading
import time

import pytest
from helpers import load_bench_script


def echo_server() -> tuple[int, threading.Event]:
    """A TCP server that answers every chunk it reads with the same bytes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()

    def serve():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)
        sock.close()
    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1], stop


def round_trip(port: int, payload: bytes) -> float:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        t0 = time.monotonic()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
        elapsed = time.monotonic() - t0
    assert got == payload   # bytes arrive whole and in order
    return elapsed


def test_the_proxy_adds_its_latency_each_way():
    proxy_mod = load_bench_script("delay_proxy")
    port, stop = echo_server()
    try:
        direct = min(round_trip(port, b"x" * 1000) for _ in range(3))
        with proxy_mod.DelayProxy(port, one_way_s=0.1) as proxy:
            delayed = [round_trip(proxy.port, bytes(range(256)) * 400) for _ in range(3)]
    finally:
        stop.set()
    assert all(d >= 0.2 for d in delayed)             # 2 x 0.1 s, never less
    assert min(delayed) - direct < 0.2 + 0.15         # and not much more


def test_the_judge_serves_sequences_on_its_slots_then_scores_with_the_builtin_reward(monkeypatch):
    monkeypatch.setenv("ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE", "0.1")
    monkeypatch.setenv("ASR_GRPO_JUDGE_SLOTS", "2")
    judge = load_bench_script("judge_reward")
    from asr_grpo.rewards.asr_reward import reward_func

    responses = ["language English<asr_text>the cat", "language English<asr_text>a"] * 2
    kw = {"languages": ["en"] * 4, "responses": responses}
    labels = ["the cat", "the dog"] * 2
    t0 = time.monotonic()
    got = judge.reward_func(responses, [""] * 4, labels, **kw)
    elapsed = time.monotonic() - t0
    # 4 sequences over 2 slots: two waves of 0.1 s (one slot per request would take 0.4 s)
    assert 0.2 <= elapsed < 0.35
    want = reward_func(responses, [""] * 4, labels, **kw)
    assert got["rewards"].tolist() == want["rewards"].tolist()
    # Two requests at once share the slots, first come first served: 2 + 2 sequences, two waves.
    t0 = time.monotonic()
    threads = [threading.Thread(target=judge.reward_func, args=(responses[:2], ["", ""], labels[:2]),
                                kwargs={"languages": ["en"] * 2, "responses": responses[:2]}) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.2 <= time.monotonic() - t0 < 0.35


def test_the_ideal_hides_what_the_service_drains_before_the_decode_ends():
    bench = load_bench_script("remote_reward")
    # 4 sequences finishing at 0.1..0.4 s of a 1 s decode; 1 slot at 0.1 s a sequence,
    # no latency: all answered by 0.5 s, so the whole measured wait of 0.45 s hides.
    rec = {"started_at": 100.0, "decoded_at": 101.0, "finished_at": [100.1, 100.2, 100.3, 100.4],
           "perf/time/step": 3.0, "perf/time/reward_wait": 0.45}
    step, exposed = bench.ideal_step(rec, (0.1, 1, 0.0))
    assert exposed == 0.0 and step == pytest.approx(3.0 - 0.45)
    # Finishing at the decode's end: nothing can hide (4 x 0.1 s left after it).
    late = {**rec, "finished_at": [101.0] * 4, "perf/time/reward_wait": 0.4}
    step, exposed = bench.ideal_step(late, (0.1, 1, 0.0))
    assert exposed == pytest.approx(0.4) and step == pytest.approx(3.0)
    # Two slots and a 0.1 s round trip: two waves of 0.1 s after the decode, plus the trip.
    step, exposed = bench.ideal_step({**late, "perf/time/reward_wait": 0.5}, (0.1, 2, 0.05))
    assert exposed == pytest.approx(0.2 + 0.1) and step == pytest.approx(3.0 - 0.2)
    spread = bench.finish_spread([rec])
    assert spread["p10"] == pytest.approx(0.1) and spread["p90"] == pytest.approx(0.4)


def test_the_stand_in_service_runs_on_its_cores_and_answers_through_the_proxy():
    import json
    import os
    import urllib.request

    bench = load_bench_script("remote_reward")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    trainer, service = bench.split_cores()
    assert trainer and service and not trainer & service and trainer | service == os.sched_getaffinity(0)
    procs, url = bench.start_service((0.0, 2, 0.05), port, service)
    try:
        assert [os.sched_getaffinity(p.pid) for p in procs] == [service] * 2
        body = json.dumps({"query": ["language English<asr_text>the cat"], "prompts": [""], "labels": ["the cat"],
                           "responses": ["language English<asr_text>the cat"], "languages": ["en"]}).encode()
        t0 = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}),
                                    timeout=30) as r:
            answer = json.loads(r.read())
        assert time.monotonic() - t0 >= 0.1                  # through the proxy: 2 x 0.05 s
        assert len(answer["rewards"]) == 1 and answer["rewards"][0] > 0
    finally:
        bench.stop_service(procs)
    assert all(p.returncode is not None for p in procs)


def test_steps_pair_only_where_both_runs_did_the_same_work():
    bench = load_bench_script("remote_reward")
    none = [{"overlap/rows_decoded": 300.0, "reward/total": 0.5}, {"overlap/rows_decoded": 280.0, "reward/total": 0.6}]
    assert bench.same_work(none, [dict(r) for r in none])
    assert not bench.same_work(none, [none[0], {**none[1], "reward/total": 0.61}])        # other tokens sampled
    assert not bench.same_work(none, [none[0], {**none[1], "overlap/rows_decoded": 290.0}])
    assert not bench.same_work(none, none[:1])                                            # a step short
    assert not bench.same_work([{"reward/total": 0.5}], [{"reward/total": 0.5}])          # nothing to tell by
