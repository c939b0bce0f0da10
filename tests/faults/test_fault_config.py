"""Bad configuration, one injected fault at a time: rejected before Ray starts (and before
the SFT checkpoint or the corpus is built), with the key and the reason in the message."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray
from helpers import compose_cfg

from asr_grpo.recipes.rl import RLRecipe

# fault -> (overrides, what the message must say). Caught at composition (typed schema).
SCHEMA_FAULTS = {
    "unknown key": (["trainer.stepz=3"], "Could not override 'trainer.stepz'"),
    "wrong type": (["trainer.steps=many"], "trainer.steps"),
    "wrong type in a list": (["overlap.chunk_candidates=[8,big]"], "overlap.chunk_candidates"),
    "unknown choice": (["reward.on_bad_reward=ignore"], "Invalid value 'ignore', expected one of [error, drop]"),
}
# Caught by the checks at set-up (validate_config, plan_placement).
COMBINATION_FAULTS = {
    "unknown key, force-added": (["+trainer.stepz=3"], "Key 'stepz' not in 'TrainerConfig' full_key: trainer.stepz"),
    "B not divisible by ranks": (["trainer.prompts_per_step=3", "placement.actor_num_ranks=2"],
                                 "trainer.prompts_per_step=3 is not divisible by placement.actor_num_ranks=2"),
    "delta_min > delta_max": (["overlap.delta_min=3", "overlap.delta_max=1"],
                              "overlap.delta_min=3 / overlap.delta_max=1: need 0 <= delta_min <= delta_max"),
    "chunk 0": (["overlap=oppo", "overlap.chunk_size=0"], "overlap.chunk_size=0: must be >= 1"),
    "placement fractions over 1": (["placement.actor_gpus=0.8", "placement.ref_gpus=0.5"],
                                   "placement.actor_gpus=0.8 + placement.ref_gpus=0.5 = 1.3"),
    "PPO without a critic": (["algorithm=ppo", "algorithm.use_critic=false"],
                             "algorithm.name=ppo needs a critic: set algorithm.use_critic=true"),
    "a wall-clock cap of zero": (["trainer.max_minutes=0"], "trainer.max_minutes=0.0: must be > 0"),
    "a weight average that never moves": (["trainer.ema_decay=1.0"],
                                          "trainer.ema_decay=1.0: must be in [0, 1) (0: no weight average)"),
    "dynamic sampling with a negative bound": (["algorithm.dynamic_sampling.max_extra_groups=-2"],
                                               "algorithm.dynamic_sampling.max_extra_groups=-2: must be >= 0"),
    "one trained sample with rloo": (["algorithm.train_samples_per_prompt=1"],
                                     "algorithm.train_samples_per_prompt=1: must be >= 2 for advantage_estimator=rloo"),
}


@pytest.mark.parametrize("fault", list(SCHEMA_FAULTS))
def test_schema_fault_is_rejected_naming_the_key(tmp_path, fault):
    overrides, needle = SCHEMA_FAULTS[fault]
    with pytest.raises(Exception) as err:
        compose_cfg(tmp_path, *overrides)
    assert needle in f"{err.value} {err.value.__cause__}"


@pytest.mark.parametrize("fault", list(COMBINATION_FAULTS))
def test_impossible_combination_is_rejected_before_ray_starts(tmp_path, fault):
    overrides, needle = COMBINATION_FAULTS[fault]
    assert not ray.is_initialized()
    with pytest.raises(ValueError) as err:
        RLRecipe(compose_cfg(tmp_path, *overrides)).setup()
    assert needle in str(err.value)
    assert not ray.is_initialized()
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "checkpoints").exists()


def test_the_command_line_names_the_bad_key_and_starts_nothing(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-m", "asr_grpo.run", "trainer.stepz=3", f"paths.output_root={tmp_path}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert "Key 'stepz' not in 'TrainerConfig'" in done.stderr + done.stdout
    assert not any(tmp_path.iterdir())   # no corpus, no checkpoint, no MLflow store


def test_an_impossible_combination_on_the_command_line_is_one_message_without_traceback(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-m", "asr_grpo.run", "overlap.chunk_size=0",
                           f"paths.output_root={tmp_path}"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "asr_grpo.run: invalid configuration: overlap.chunk_size=0: must be >= 1" in done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]   # Hydra's run folder only: no corpus, no store
