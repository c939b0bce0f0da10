"""Every config group composes into the typed schema; bad keys and types fail naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import ConfigError, validate_config

register_configs()
GROUPS = ["data", "model", "sft", "placement", "algorithm", "overlap", "rollout", "reward", "trainer", "logger"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def _compose(config_name: str = "config", overrides: list[str] | None = None):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides or [])


def test_required_group_options_exist():
    assert {"colocate", "separate"} <= set(_options("placement"))
    assert {"grpo", "ppo"} <= set(_options("algorithm"))
    assert {"none", "intra", "inter", "oppo"} <= set(_options("overlap"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_group_option_composes(group, option):
    cfg = _compose(overrides=[f"{group}={option}"])
    OmegaConf.resolve(cfg)
    assert OmegaConf.is_config(cfg[group])


@pytest.mark.parametrize("name", ["config", "sft"])
@pytest.mark.parametrize("extra", [[]] + [[f"experiment={e}"] for e in _options("experiment")]
                         + [[f"debug={d}"] for d in _options("debug")])
def test_entry_configs_compose_with_experiments_and_debug(name, extra):
    cfg = _compose(name, extra)
    OmegaConf.resolve(cfg)
    assert cfg.model.tokenizer_vocab_size > 0


def test_overlap_modes_set_their_mode():
    for mode in ["none", "intra", "inter", "oppo"]:
        assert _compose(overrides=[f"overlap={mode}"]).overlap.mode == mode


def test_rl_run_starts_from_the_sft_checkpoint():
    cfg = _compose()
    assert cfg.model.path == cfg.sft.output_dir


@pytest.mark.parametrize("group", GROUPS)
def test_schema_rejects_unknown_key(group):
    with pytest.raises(Exception) as err:
        _compose(overrides=[f"{group}.not_a_knob=1"])
    assert "not_a_knob" in str(err.value)


@pytest.mark.parametrize("override,key", [
    ("trainer.steps=many", "trainer.steps"),
    ("sft.lr=fast", "sft.lr"),
    ("algorithm.kl_in_reward=maybe", "algorithm.kl_in_reward"),
    ("overlap.chunk_candidates=oops", "overlap.chunk_candidates"),
])
def test_schema_rejects_wrong_type_naming_the_key(override, key):
    with pytest.raises(Exception) as err:
        _compose(overrides=[override])
    assert key in str(err.value)


@pytest.mark.parametrize("key,options", [
    ("overlap.mode", "none, intra, inter, oppo"),
    ("placement.name", "colocate, separate"),
    ("trainer.lr_scheduler", "constant, constant_with_warmup, cosine, linear"),
])
def test_a_choice_outside_its_set_fails_at_composition_listing_the_options(key, options):
    with pytest.raises(Exception) as err:
        _compose(overrides=[f"{key}=sometimes"])
    text = str(err.value) + str(err.value.__cause__)
    assert key in text and f"expected one of [{options}]" in text


@pytest.mark.parametrize("key,names", [
    ("algorithm.advantage_estimator", "group_norm, rloo, reinforce_baseline, dr_grpo, gae"),
    ("algorithm.policy_loss", "ppo_clip, gspo, gspo_token, mwer"),
    ("overlap.controller", "fixed, trial, cost_model"),
    ("rollout.engine", "hf, vllm"),
])
def test_a_name_outside_its_registry_fails_validation_listing_the_registered(key, names):
    import asr_grpo.overlap.planners  # noqa: F401  (the RL recipe loads every registry before it validates)
    import asr_grpo.workers.rollout  # noqa: F401

    with pytest.raises(ConfigError) as err:
        validate_config(_compose(overrides=[f"{key}=sometimes"]))
    assert str(err.value) == f"invalid configuration: {key}=sometimes: expected one of {names}"


def test_a_reward_weight_must_name_a_registered_component(tmp_path):
    import asr_grpo.rewards  # noqa: F401  (registers the components)

    with pytest.raises(ConfigError, match="reward.weights: loudness: not a reward component; "
                                          "registered: cer, keyword, language, smoothness"):
        validate_config(_compose(overrides=["+reward.weights.loudness=1.0"]))
    # A reward file of one's own (or a reward service) reads the weights its own way.
    own = tmp_path / "loud.py"
    own.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return [0.0] * len(queries)\n")
    validate_config(_compose(overrides=["+reward.weights.loudness=1.0", f"reward.reward_file={own}"]))


def test_the_score_component_must_be_one_the_reward_computes():
    import asr_grpo.rewards  # noqa: F401  (registers the components)

    with pytest.raises(ConfigError, match="algorithm.score_component=loudness: not a reward component; "
                                          "registered: cer, keyword, language, smoothness"):
        validate_config(_compose(overrides=["algorithm.score_component=loudness"]))
    validate_config(_compose(overrides=["algorithm.score_component=keyword"]))


def test_the_objectives_compose_by_name():
    dr = _compose(overrides=["algorithm=dr_grpo"]).algorithm
    assert (dr.name, dr.advantage_estimator, dr.loss_agg, dr.policy_loss) == \
        ("dr_grpo", "dr_grpo", "seq_mean_token_sum_norm", "ppo_clip")
    mwer = _compose(overrides=["algorithm=mwer"]).algorithm
    assert (mwer.policy_loss, mwer.advantage_estimator, mwer.score_component, mwer.use_critic) == \
        ("mwer", "dr_grpo", "cer", False)
    # Both start from GRPO's recipe: what is not the objective stays the same.
    grpo = _compose(overrides=["algorithm=grpo"]).algorithm
    for key in ("n_samples_per_prompt", "train_samples_per_prompt", "temperature", "kl_coef"):
        assert dr[key] == mwer[key] == grpo[key], key
    validate_config(_compose(overrides=["algorithm.policy_loss=gspo"]))
    validate_config(_compose(overrides=["algorithm=ppo", "algorithm.policy_loss=gspo_token"]))   # per-token GAE fits


def test_the_45_minute_experiment_trains_dr_grpo_and_the_command_line_still_picks_the_objective():
    adopted = _compose(overrides=["experiment=grpo_45min"]).algorithm
    assert (adopted.name, adopted.advantage_estimator, adopted.loss_agg) == \
        ("dr_grpo", "dr_grpo", "seq_mean_token_sum_norm")
    assert adopted.n_samples_per_prompt == 16   # the experiment's own values land on the adopted objective
    earlier = _compose(overrides=["experiment=grpo_45min", "algorithm=grpo"]).algorithm
    assert (earlier.advantage_estimator, earlier.loss_agg, earlier.n_samples_per_prompt) == ("rloo", "token_mean", 16)


def test_group_file_with_unknown_key_is_rejected(tmp_path):
    # A user's own group file with a typo fails at composition, not deep inside a run.
    conf = tmp_path / "conf"
    for src in Path(CONF_DIR).rglob("*.yaml"):
        dst = conf / src.relative_to(CONF_DIR)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(src.read_text())
    (conf / "trainer" / "typo.yaml").write_text("stepz: 3\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        with pytest.raises(Exception) as err:
            compose(config_name="config", overrides=["trainer=typo"])
    assert "stepz" in str(err.value)


@pytest.mark.parametrize("overrides,needle", [
    (["overlap.delta_min=3", "overlap.delta_max=1"], "overlap.delta_min=3 / overlap.delta_max=1"),
    (["overlap.chunk_size=0"], "overlap.chunk_size=0"),
    (["algorithm=ppo", "algorithm.use_critic=false"], "algorithm.name=ppo needs a critic"),
    (["placement.actor_num_ranks=3"], "not divisible by placement.actor_num_ranks=3"),
    (["algorithm.n_samples_per_prompt=1"], "algorithm.n_samples_per_prompt must be >= 2"),
    (["algorithm.kl_in_reward=true"], "algorithm.kl_in_reward=true is only supported"),
    (["algorithm.dual_clip=0.5"], "algorithm.dual_clip=0.5"),
    (["algorithm.dynamic_sampling.max_extra_groups=-1"], "algorithm.dynamic_sampling.max_extra_groups=-1: must be >= 0"),
    (["algorithm.dynamic_sampling.enabled=true", "algorithm.advantage_estimator=reinforce_baseline",
      "algorithm.n_samples_per_prompt=1"],
     "algorithm.dynamic_sampling.enabled=true drops groups whose rewards are all equal: it needs at least 2 trained "
     "samples a prompt (algorithm.n_samples_per_prompt=1, algorithm.train_samples_per_prompt=8)"),
    (["algorithm=ppo", "algorithm.dynamic_sampling.enabled=true"],
     "algorithm.dynamic_sampling.enabled=true with algorithm.advantage_estimator=gae: a critic"),
    (["algorithm=ppo", "algorithm.policy_loss=gspo"],
     "algorithm.policy_loss=gspo takes one advantage per sequence and no critic: set algorithm.use_critic=false"),
    (["algorithm=ppo", "algorithm.policy_loss=mwer"], "algorithm.policy_loss=mwer takes one advantage per sequence"),
    (["algorithm=mwer", "algorithm.advantage_estimator=group_norm"],
     "algorithm.policy_loss=mwer needs algorithm.advantage_estimator in dr_grpo, reinforce_baseline (got group_norm)"),
    (["algorithm=mwer", "trainer.micro_batch_size=3", "algorithm.n_samples_per_prompt=4"],
     "needs trainer.micro_batch_by_group=true and trainer.micro_batch_size (got 3) a multiple of the 4 samples"),
    (["algorithm=mwer", "trainer.micro_batch_by_group=false"], "needs trainer.micro_batch_by_group=true"),
    (["algorithm=mwer", "algorithm.stale_is_correction=true"],
     "algorithm.policy_loss=mwer takes no importance weights: set algorithm.stale_is_correction=false"),
    (["algorithm.gspo_eps_clip_low=0"], "algorithm.gspo_eps_clip_low=0.0 / gspo_eps_clip_high=0.0004: must be > 0"),
    (["algorithm=mwer", "algorithm.mwer_logp_scale=0"], "algorithm.mwer_logp_scale=0.0: must be > 0"),
    (["sft.wave_augment.speed_prob=1.5"], "sft.wave_augment.speed_prob=1.5: must be in [0, 1]"),
    (["sft.wave_augment.speed_min=1.2", "sft.wave_augment.speed_max=1.1"], "speed_min=1.2, speed_max=1.1"),
    (["sft.wave_augment.babble_talkers=0"], "sft.wave_augment.babble_talkers=0"),
    (["sft.wave_augment.babble_snr_db_min=30"], "babble_snr_db_min=30.0 is above babble_snr_db_max=25.0"),
    (["trainer.wave_augment.babble_prob=-0.1"], "trainer.wave_augment.babble_prob=-0.1: must be in [0, 1]"),
    (["+trainer.wave_augment.conditions.street=0.2"],
     "trainer.wave_augment.conditions.street: no such condition in data.train_conditions (known: room, phone, noise)"),
    (["sft.wave_augment.conditions.room=0.6", "sft.wave_augment.conditions.phone=0.6"],
     "sft.wave_augment.conditions: probabilities sum to 1.2; at most one condition an utterance"),
    (["data.train_conditions.room.room.rt60_s=[[0.5,0.2]]"], "data.train_conditions.room.room.rt60_s=[[0.5, 0.2]]"),
    (["data.heldout_conditions.noise.noise.snr_db=[]"], "data.heldout_conditions.noise.noise.snr_db=[]: need [low, high]"),
    (["data.heldout_conditions.phone.channel.band_hz=[300,5000]"], "the line samples at 8 kHz"),
    (["data.num_heldout_conditions=-1"], "data.num_heldout_conditions=-1: must be >= 0"),
    (["sft.conditions_from_step=-1"], "sft.conditions_from_step=-1: must be >= 0"),
    (["sft.wave_augment.conditions.room=0.2", "sft.conditions_from_step=2400"],
     "sft.conditions_from_step=2400 is not below sft.max_steps=2400: sft.wave_augment.conditions would never"),
    (["reward=remote", "reward.remote.urls=[judge:5000]"], "'judge:5000' is not an http(s) URL"),
    (["reward=remote", "reward.remote.max_in_flight=0"], "reward.remote.max_in_flight=0: must be >= 1"),
    (["reward=remote", "reward.remote.backoff_s=20"], "reward.remote.backoff_s=20.0, backoff_max_s=10.0"),
    (["reward=remote", "reward.reward_file=x.py"], "reward.reward_file and reward.remote.urls are both set"),
    (["model.lora.rank=-1"], "model.lora.rank=-1: must be >= 0"),
    (["reward.hang_retries=-1"], "reward.hang_retries=-1: must be >= 0"),
    (["rollout.weight_sync_timeout_s=0"], "rollout.weight_sync_timeout_s=0.0: must be > 0"),
    (["model.lora.rank=8", "model.lora.alpha=0"], "model.lora.alpha=0.0: must be > 0"),
    (["model.lora.rank=8", "model.lora.dropout=1"], "model.lora.dropout=1.0: must be in [0, 1)"),
    (["model.lora.rank=8", "model.lora.target_modules=[]"], "LoRA needs modules to adapt"),
    (["model.lora.rank=8", "model.lora.target_modules=[self_attn.q_proj]"], "give module names"),
    (["model.lora.rank=8", "trainer.zero_stage=3"], "model.lora.rank=8 with trainer.zero_stage=3: not supported"),
    (["model.lora.rank=8", "model.freeze_audio_encoder=false"], "model.lora.encoder_target_modules=[q_proj"),
])
def test_impossible_combinations_are_rejected_naming_the_keys(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate_config(_compose(overrides=overrides))
    assert needle in str(err.value)


def test_lora_takes_the_reference_into_the_policy_only_where_roles_are_colocated():
    from asr_grpo.models.lora import reference_in_policy, reference_role_needed
    from asr_grpo.workers.threads import side_by_side

    cases = {"colocate": (True, False, 1), "separate": (False, True, 2)}   # in policy, ref role, ranks scoring
    for placement, (in_policy, role, shared) in cases.items():
        cfg = _compose(overrides=["model.lora.rank=8", f"placement={placement}"])
        validate_config(cfg)
        assert (reference_in_policy(cfg), reference_role_needed(cfg)) == (in_policy, role)
        assert side_by_side(cfg, 1)["shared"] == shared   # the policy, and the reference rank where there is one
    plain = _compose(overrides=["placement=colocate"])
    assert (reference_in_policy(plain), reference_role_needed(plain)) == (False, True)
    assert not reference_role_needed(_compose(overrides=["model.lora.rank=8", "algorithm.kl_coef=0"]))


def test_every_shipped_combination_is_valid():
    for algo in _options("algorithm"):
        for placement in _options("placement"):
            validate_config(_compose(overrides=[f"algorithm={algo}", f"placement={placement}"]))


