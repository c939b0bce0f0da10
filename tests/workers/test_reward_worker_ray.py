"""RewardWorker as a real Ray actor in a local Ray."""
import pytest

from asr_grpo.rewards import RewardResult
from asr_grpo.workers.reward import remote_reward_worker

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_worker_scores_a_batch(local_ray, tmp_path):
    worker = remote_reward_worker().options(num_cpus=0).remote("", weights={"cer": 1.0})
    batch = {"queries": ["p:the cat", "p:我爱北京天门"], "prompts": ["p:", "p:"],
             "labels": ["the cat", "我爱北京天安门"], "languages": ["en", "zh"],
             "sample_ids": ["a", "b"]}
    out = ray.get(worker.score.remote(batch), timeout=60)
    result = RewardResult.from_dict(out)
    assert result.total.tolist() == pytest.approx([1.0, 6 / 7], abs=1e-6)
    assert set(result.components) == {"cer", "keyword", "language", "smoothness"}

    bad = tmp_path / "bad.py"
    bad.write_text("def reward_func(q, p, l, **kw):\n"
                   "    return {'rewards': [float('nan')] * len(q)}\n")
    failing = remote_reward_worker().options(num_cpus=0).remote(str(bad))
    pattern = r"non-finite values in rewards: samples \['a', 'b'\]"
    with pytest.raises(ray.exceptions.RayTaskError, match=pattern):
        ray.get(failing.score.remote(batch), timeout=60)
