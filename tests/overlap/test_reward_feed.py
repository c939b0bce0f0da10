"""The feed of finished sequences that a reward service gets under intra/oppo: a running
decode hands out what finished (another thread reads it), and the scheduler sends each
finished sequence to `on_finished` exactly once, whatever the plan's chunk."""
from __future__ import annotations

import threading
import time

import pytest
from omegaconf import OmegaConf
from scripted_rollout import B, ScriptedEngine, ScriptedHost, prompts

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.rollout.types import RolloutRequest


class SlowEngine(ScriptedEngine):
    """Each round takes a little wall time, so another thread can look in between."""

    def _advance(self, quota) -> int:
        time.sleep(0.01)
        return super()._advance(quota)


def requests(k: int) -> list[RolloutRequest]:
    return [r for g in prompts()(k) for r in g.requests()]


def test_a_decode_hands_out_its_finished_sequences_while_it_runs():
    engine = SlowEngine()
    engine.add_requests(requests(4))
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(touched=engine.decode(feed=True)))
    worker.start()
    taken = []
    while worker.is_alive():
        taken.append(engine.take_finished())
        time.sleep(0.005)
    worker.join()
    during = [r.uid for part in taken for r in part]
    after = [r.uid for r in engine.take_finished()]
    assert sum(1 for part in taken if part) >= 2     # handed out in several batches as they finished
    assert sorted(during + after) == sorted(s.request.uid for s in out["touched"])   # each once
    assert all(s.done for part in taken for s in part)
    # A decode that does not feed queues nothing.
    engine.add_requests(requests(1))
    engine.decode()
    assert engine.take_finished() == []


def feeding_scheduler(mode: str, sent: list, waits: list, **overlap) -> RolloutScheduler:
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, **{"controller": "fixed", **overlap}))

    def wait(calls, seconds):   # in process a call has ended when it is made: poll twice anyway
        waits.append(seconds)
        return len(waits) % 3 == 0

    return RolloutScheduler(cfg, B, LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                            on_finished=lambda groups, seqs: sent.extend(s.uid for s in seqs),
                            wait=wait, feed_every_s=0.02)


@pytest.mark.parametrize("mode, overlap", [("intra", {"chunk_size": 4}), ("oppo", {"chunk_size": 3, "delta_init": 2}),
                                           ("intra", {"controller": "cost_model"})])
def test_each_finished_sequence_is_sent_once_whatever_the_chunk(mode, overlap):
    sent, waits = [], []
    sched = feeding_scheduler(mode, sent, waits, **overlap)
    new_groups = prompts()
    trained = []
    for step in range(3):
        out = sched.rollout(step, new_groups(sched.groups_wanted(step), step))
        trained += [s.uid for rs in out.results.values() for s in rs]
        assert out.metrics["overlap/rewards_sent_during_decode"] > 0
    assert waits and set(waits) == {0.02}
    assert len(sent) == len(set(sent))                 # never twice
    assert set(trained) <= set(sent)                   # every trained sequence went out
    carried_done = {s.uid for e in sched.buffer for s in e.samples.values() if s.done}
    assert set(sent) == set(trained) | carried_done    # and nothing that has not finished


def test_without_a_streaming_mode_nothing_is_fed():
    sent = []
    sched = RolloutScheduler(OmegaConf.structured(OverlapConfig(mode="none", controller="fixed")), B,
                             LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                             on_finished=lambda groups, seqs: sent.extend(seqs), wait=lambda c, s: True)
    new_groups = prompts()
    sched.rollout(0, new_groups(sched.groups_wanted(0), 0))
    assert sent == [] and not sched.feeds
