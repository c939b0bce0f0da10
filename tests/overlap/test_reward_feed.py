"""The feed of finished sequences that a reward service gets under intra/oppo: a running
decode pushes what finished to an inbox (at most every `every_s`), and the scheduler
sends each finished sequence to `on_finished` exactly once, whatever the plan's chunk."""
from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf
from scripted_rollout import B, ScriptedEngine, ScriptedHost, prompts

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.rollout.feed import FeedInbox, FeedSink
from asr_grpo.rollout.types import RolloutRequest


class SlowEngine(ScriptedEngine):
    """Each round takes a little wall time, so the feed's period spans several rounds."""

    def _advance(self, quota) -> int:
        time.sleep(0.01)
        return super()._advance(quota)


class Pushes(FeedInbox):
    """An inbox that also keeps each push as it came."""

    def __init__(self):
        super().__init__()
        self.pushes: list[list[str]] = []

    def put(self, results):
        self.pushes.append([r.uid for r in results])
        super().put(results)


def requests(k: int) -> list[RolloutRequest]:
    return [r for g in prompts()(k) for r in g.requests()]


def test_a_decode_pushes_its_finished_sequences_while_it_runs():
    engine, inbox = SlowEngine(), Pushes()
    engine.add_requests(requests(4))
    touched = engine.decode(feed=FeedSink(inbox, every_s=0.0))
    finished = [s.request.uid for s in touched if s.done]
    pushed = [u for push in inbox.pushes for u in push]
    assert len(inbox.pushes) >= 2                      # in several pushes, as they finished
    assert sorted(pushed) == sorted(finished)          # each finished sequence once, nothing else
    assert all(r.done for r in inbox.take()) and inbox.take() == []


def test_the_feed_pushes_at_most_once_a_period():
    engine, inbox = SlowEngine(), Pushes()
    engine.add_requests(requests(4))
    engine.decode(feed=FeedSink(inbox, every_s=60.0))
    assert inbox.pushes == []        # the period never passed: the call's results carry them
    engine.add_requests(requests(1))
    engine.decode()                  # a decode that does not feed pushes nothing
    assert inbox.pushes == []


def feeding_scheduler(mode: str, sent: list, waits: list, **overlap) -> RolloutScheduler:
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, **{"controller": "fixed", **overlap}))

    def wait(calls, seconds):   # in process a call has ended when it is made: poll twice anyway
        waits.append(seconds)
        return len(waits) % 3 == 0

    return RolloutScheduler(cfg, B, LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                            on_finished=lambda groups, seqs: sent.extend(s.uid for s in seqs),
                            wait=wait, feed=FeedSink(FeedInbox(), every_s=0.0))


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
        # A push that lands after its call ended (Ray's fire-and-forget put): the next
        # step's take finds sequences of groups already trained; none goes out again.
        sched.feed.inbox.put([s for rs in out.results.values() for s in rs])
    assert waits and set(waits) == {0.0}
    assert len(sent) == len(set(sent))                 # never twice
    assert set(trained) <= set(sent)                   # every trained sequence went out
    carried_done = {s.uid for e in sched.buffer for s in e.samples.values() if s.done}
    assert set(sent) == set(trained) | carried_done    # and nothing that has not finished


def test_without_a_streaming_mode_nothing_is_fed():
    sent = []
    sched = RolloutScheduler(OmegaConf.structured(OverlapConfig(mode="none", controller="fixed")), B,
                             LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                             on_finished=lambda groups, seqs: sent.extend(seqs), wait=lambda c, s: True,
                             feed=FeedSink(FeedInbox(), every_s=0.0))
    new_groups = prompts()
    sched.rollout(0, new_groups(sched.groups_wanted(0), 0))
    assert sent == [] and not sched.feeds and sched.feed is None
