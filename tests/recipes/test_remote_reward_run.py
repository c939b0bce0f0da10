"""The RL step with its reward served over HTTP (the real reward server on loopback):
under a streaming plan the sequences go to the service while the rollout decodes, with
the rewards and experience the serial step gets. (That the server's rewards equal the
local reward file's: tests/rewards/test_reward_server.py.)"""
from __future__ import annotations

import threading
import time

import pytest
import ray
import torch
import uvicorn
from helpers import compose_cfg

from asr_grpo.distributed.net import free_port
from asr_grpo.recipes.rl import RLRecipe
from asr_grpo.rewards.server import ServerSettings, build_app

pytestmark = [pytest.mark.long, pytest.mark.slow]


@pytest.fixture(scope="module")
def reward_url():
    """The built-in ASR reward served by `asr-grpo-reward-server`'s app in this process."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(ServerSettings()), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the reward server did not start"
    yield f"http://127.0.0.1:{port}/score"
    server.should_exit = True
    thread.join(10)


def first_step(root, name: str, *overrides: str):
    """One GRPO step by hand; returns (rollout, the reward client's requests made during
    the rollout, items, metrics)."""
    cfg = compose_cfg(root, "overlap.chunk_size=3", "algorithm.max_new_tokens=20",
                      f"trainer.output_dir={root}/remote_{name}", *overrides)
    recipe = RLRecipe(cfg)
    try:
        recipe.setup()
        wanted = recipe.scheduler.groups_wanted(0)
        rollout = recipe.scheduler.rollout(0, [recipe._group(i, 0) for i in recipe.sampler.next(wanted)])
        during = 0.0
        if recipe.remote_reward:
            during = sum(s["reward/remote/requests"] for s in ray.get(recipe.reward.call("take_request_stats")))
        items, metrics = recipe.maker.make(rollout.groups, rollout.results, rollout.streamed,
                                           version=recipe.weights_version)
        return rollout, during, items, metrics
    finally:
        recipe.cleanup()


# Fed (the default) through chunks of 3, and from one decode call (the cost-model
# planner's first steps are serial: the host sends what finished while the call runs);
# and with the feed off.
@pytest.mark.parametrize("plan, calls", [(("overlap.controller=fixed",), "several"),
                                         (("overlap.controller=cost_model", "reward.remote.feed=true",
                                           "reward.remote.feed_every_s=0.005"), "one"),
                                         (("overlap.controller=fixed", "reward.remote.feed=false"), "not fed")])
def test_served_rewards_stream_during_the_rollout_with_the_serial_experience(root, reward_url, plan, calls):
    remote = f"reward.remote.urls=[{reward_url}]"
    _, before, s_items, serial = first_step(root, "serial", "overlap=none", remote)
    rollout, during, t_items, streamed = first_step(root, "streamed", "overlap=intra", remote, *plan)
    assert before == 0            # serially the service hears of nothing until the rollout is over
    if calls == "not fed":        # the whole batch after the rollout, as in every other mode
        assert during == 0 and rollout.metrics["overlap/rewards_sent_during_decode"] == 0
    else:
        assert during > 0         # fed: requests went out while the actor decoded
        assert rollout.metrics["overlap/rewards_sent_during_decode"] > 0   # before the decode's last call ended
    if calls == "one":
        assert rollout.metrics["overlap/decode_calls"] == 1 and rollout.plan.chunk is None
    else:   # streamed in chunks
        assert rollout.metrics["overlap/decode_calls"] > 1
    assert serial["reward/remote/requests"] >= 1 and serial["reward/remote/failed_requests"] == 0
    for key in ("reward/total", "reward/cer", "reward/keyword", "reward/language", "reward/smoothness"):
        assert streamed[key] == pytest.approx(serial[key], abs=1e-6), key
    assert [it.uid for it in t_items] == [it.uid for it in s_items]
    for a, b in zip(s_items, t_items):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(b.advantages, a.advantages, atol=1e-6, rtol=0)
    assert streamed["perf/time/reward_wait"] >= 0.0
