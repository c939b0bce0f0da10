"""The feed of finished sequences that a reward service gets under intra/oppo: a running
decode sends what finished (at most every `every_s`) straight to the reward, the host
hands the driver those calls after the decode, and the scheduler sends each finished
sequence exactly once (by the feed or after the call), whatever the plan's chunk."""
from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf
from scripted_rollout import B, ScriptedEngine, ScriptedHost, prompts

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.rollout.feed import FeedSink
from asr_grpo.rollout.types import RolloutRequest


class SlowEngine(ScriptedEngine):
    """Each round takes a little wall time, so the feed's period spans several rounds."""

    def _advance(self, quota) -> int:
        time.sleep(0.01)
        return super()._advance(quota)


class Recorder:
    """A feed target in process: each send is one call, named by its position."""

    def __init__(self):
        self.sends: list[list[str]] = []
        self.groups: list[set[str]] = []

    def for_groups(self, groups):
        self.groups.append(set(groups))
        return self

    def send(self, results):
        self.sends.append([r.uid for r in results])
        return len(self.sends) - 1


def requests(k: int) -> list[RolloutRequest]:
    return [r for g in prompts()(k) for r in g.requests()]


def test_a_decode_sends_its_finished_sequences_while_it_runs():
    engine, target = SlowEngine(), Recorder()
    engine.add_requests(requests(4))
    sink = FeedSink(target, every_s=0.0)
    touched = engine.decode(feed=sink)
    finished = [s.request.uid for s in touched if s.done]
    sent = [u for uids in target.sends for u in uids]
    assert len(target.sends) >= 2                      # in several sends, as they finished
    assert sorted(sent) == sorted(finished)            # each finished sequence once, nothing else
    assert sink.take_sent() == list(enumerate(target.sends)) and sink.take_sent() == []


def test_the_feed_sends_at_most_once_a_period():
    engine, target = SlowEngine(), Recorder()
    engine.add_requests(requests(4))
    engine.decode(feed=FeedSink(target, every_s=60.0))
    assert target.sends == []        # the period never passed: the call's results carry them
    engine.add_requests(requests(1))
    engine.decode()                  # a decode that does not feed sends nothing
    assert target.sends == []


def feeding_scheduler(mode: str, sent: list, fed: list, target: Recorder, **overlap) -> RolloutScheduler:
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, **{"controller": "fixed", **overlap}))
    return RolloutScheduler(cfg, B, LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                            on_finished=lambda groups, seqs: sent.extend(s.uid for s in seqs),
                            feed=FeedSink(target, every_s=0.0),
                            on_fed=lambda call, uids: fed.append((call, list(uids))))


@pytest.mark.parametrize("mode, overlap", [("intra", {"chunk_size": 4}), ("oppo", {"chunk_size": 3, "delta_init": 2}),
                                           ("intra", {"controller": "cost_model"})])
def test_each_finished_sequence_is_sent_once_whatever_the_chunk(mode, overlap):
    sent, fed, target = [], [], Recorder()
    sched = feeding_scheduler(mode, sent, fed, target, **overlap)
    new_groups = prompts()
    trained = []
    for step in range(3):
        out = sched.rollout(step, new_groups(sched.groups_wanted(step), step))
        trained += [s.uid for rs in out.results.values() for s in rs]
        assert out.metrics["overlap/rewards_sent_during_decode"] > 0
    assert fed == list(enumerate(target.sends))       # the driver adopted every call the host made
    # each decode call knew the groups it decoded (what a send's rows are built from)
    assert target.groups and all(target.groups)
    both = sent + [u for _, uids in fed for u in uids]
    assert len(both) == len(set(both))                 # never twice, by either path
    assert set(trained) <= set(both)                   # every trained sequence went out
    carried_done = {s.uid for e in sched.buffer for s in e.samples.values() if s.done}
    assert set(both) == set(trained) | carried_done    # and nothing that has not finished


def test_without_a_streaming_mode_nothing_is_fed():
    sent, target = [], Recorder()
    sched = RolloutScheduler(OmegaConf.structured(OverlapConfig(mode="none", controller="fixed")), B,
                             LocalGroup([ScriptedHost()]), None, resolve=local_resolve,
                             on_finished=lambda groups, seqs: sent.extend(seqs),
                             feed=FeedSink(target, every_s=0.0), on_fed=lambda call, uids: None)
    new_groups = prompts()
    sched.rollout(0, new_groups(sched.groups_wanted(0), 0))
    assert sent == [] and target.sends == [] and not sched.feeds and sched.feed is None
