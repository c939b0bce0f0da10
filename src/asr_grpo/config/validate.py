"""Cross-field checks the type system can't express. They run on the composed config
before Ray starts, and every message names the key(s) and the reason. A key an
extension point selects by name (`config/registry.py`) is checked against what is
registered under it."""
from __future__ import annotations

from functools import reduce
from typing import Any

from asr_grpo.config.errors import ConfigError
from asr_grpo.config.registry import loaded_registries
from asr_grpo.config.reward_file import RewardFunctionError, load_reward_function


def schema_problem(cfg: Any) -> str | None:
    """A key the schema does not know or a value of the wrong type that composition let
    through (`+group.key=...` force-adds keys past Hydra's struct check)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from asr_grpo.config.schema import RunConfig

    plain = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    try:   # from plain values: a typed node would carry its own (stale) schema along
        OmegaConf.merge(OmegaConf.structured(RunConfig), plain)
    except OmegaConfBaseException as exc:
        return " ".join(str(exc).split())
    return None


def config_problems(cfg: Any) -> list[str]:
    """Every problem found (empty list = valid)."""
    if (problem := schema_problem(cfg)) is not None:
        return [problem]   # the checks below assume the schema's keys and types
    problems: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    problems += choice_problems(cfg)
    algo, ov, tr, pl = cfg.algorithm, cfg.overlap, cfg.trainer, cfg.placement
    n = algo.n_samples_per_prompt
    need(n >= 1, f"algorithm.n_samples_per_prompt={n}: must be >= 1")
    if algo.name == "ppo":
        need(algo.use_critic, "algorithm.name=ppo needs a critic: set algorithm.use_critic=true")
    _check_advantage_estimator(algo, need)
    _check_dynamic_sampling(algo, need)
    _check_policy_loss(algo, tr, need)
    _check_score_component(cfg, need)
    need(algo.temperature >= 0, f"algorithm.temperature={algo.temperature}: must be >= 0")
    need(0 < algo.top_p <= 1, f"algorithm.top_p={algo.top_p}: must be in (0, 1]")
    need(algo.max_new_tokens >= 1, f"algorithm.max_new_tokens={algo.max_new_tokens}: must be >= 1")
    need(algo.eps_clip_low > 0 and algo.eps_clip_high > 0, "algorithm.eps_clip_low/high must be > 0")
    need(algo.dual_clip is None or algo.dual_clip > 1,
         f"algorithm.dual_clip={algo.dual_clip}: must be > 1 (or null to disable)")

    need(ov.chunk_size >= 1, f"overlap.chunk_size={ov.chunk_size}: must be >= 1")
    need(len(ov.chunk_candidates) > 0 and all(c >= 0 for c in ov.chunk_candidates),
         f"overlap.chunk_candidates={list(ov.chunk_candidates)}: need at least one value, all >= 0 (0: no streaming)")
    need(ov.stop_check_every >= 1, f"overlap.stop_check_every={ov.stop_check_every}: must be >= 1")
    need(ov.chunk_trial_warmup >= 0 and ov.chunk_trial_steps >= 1,
         f"overlap.chunk_trial_warmup={ov.chunk_trial_warmup} / overlap.chunk_trial_steps={ov.chunk_trial_steps}: "
         "need warmup >= 0 and steps >= 1")
    need(ov.cost_model_warmup >= 1 and 0 <= ov.cost_model_margin < 1,
         f"overlap.cost_model_warmup={ov.cost_model_warmup} / overlap.cost_model_margin={ov.cost_model_margin}: "
         "need warmup >= 1 and 0 <= margin < 1")
    need(0 <= ov.delta_min <= ov.delta_max,
         f"overlap.delta_min={ov.delta_min} / overlap.delta_max={ov.delta_max}: need 0 <= delta_min <= delta_max")
    need(ov.delta_min <= ov.delta_init <= ov.delta_max,
         f"overlap.delta_init={ov.delta_init}: must lie in [delta_min={ov.delta_min}, delta_max={ov.delta_max}]")
    need(ov.delta_window >= 1, f"overlap.delta_window={ov.delta_window}: must be >= 1")
    need(0 <= ov.scorer_nice <= 19, f"overlap.scorer_nice={ov.scorer_nice}: must be in [0, 19] (os.nice)")
    need(ov.chunk_trial_period >= 0,
         f"overlap.chunk_trial_period={ov.chunk_trial_period}: must be >= 0 (0 = never trial)")

    ro = cfg.rollout
    need(ro.tensor_parallel_size >= 1, f"rollout.tensor_parallel_size={ro.tensor_parallel_size}: must be >= 1")
    need(0 < ro.gpu_memory_utilization <= 1,
         f"rollout.gpu_memory_utilization={ro.gpu_memory_utilization}: must be in (0, 1]")
    need(ro.sleep_level in (0, 1, 2), f"rollout.sleep_level={ro.sleep_level}: must be 0 (off), 1 or 2")
    need(ro.block_size >= 0, f"rollout.block_size={ro.block_size}: must be >= 0 (0: vLLM's default)")
    need(ro.sync_check_every >= 0, f"rollout.sync_check_every={ro.sync_check_every}: must be >= 0 (0: off)")
    need(ro.sync_check_sequences >= 1, f"rollout.sync_check_sequences={ro.sync_check_sequences}: must be >= 1")
    need(ro.sync_check_tol > 0, f"rollout.sync_check_tol={ro.sync_check_tol}: must be > 0")
    need(ro.weight_sync_timeout_s > 0, f"rollout.weight_sync_timeout_s={ro.weight_sync_timeout_s}: must be > 0")
    engines = loaded_registries().get("rollout.engine")   # loaded with the workers (the RL recipe's)
    if engines is not None and ro.engine in engines:
        reason = engines.get(ro.engine).unavailable_reason()
        need(reason is None, f"rollout.engine={ro.engine}: {reason}")

    need(cfg.logger.async_max_pending >= 1,
         f"logger.async_max_pending={cfg.logger.async_max_pending}: must be >= 1")
    need(tr.steps >= 1, f"trainer.steps={tr.steps}: must be >= 1")
    need(tr.max_minutes is None or tr.max_minutes > 0,
         f"trainer.max_minutes={tr.max_minutes}: must be > 0 (null: no cap)")
    need(tr.stop_grace_s >= 0, f"trainer.stop_grace_s={tr.stop_grace_s}: must be >= 0 (0: a signal abandons the step)")
    need(0 <= tr.ema_decay < 1, f"trainer.ema_decay={tr.ema_decay}: must be in [0, 1) (0: no weight average)")
    need(tr.keep_last >= 0, f"trainer.keep_last={tr.keep_last}: must be >= 0 (0 keeps every checkpoint)")
    need(tr.prompts_per_step >= 1, f"trainer.prompts_per_step={tr.prompts_per_step}: must be >= 1")
    need(tr.micro_batch_size >= 1, f"trainer.micro_batch_size={tr.micro_batch_size}: must be >= 1")
    need(tr.zero_stage in (0, 1, 2, 3), f"trainer.zero_stage={tr.zero_stage}: must be 0, 1, 2 or 3")
    need(pl.actor_num_ranks >= 1, f"placement.actor_num_ranks={pl.actor_num_ranks}: must be >= 1")
    if pl.actor_num_ranks >= 1:
        need(tr.prompts_per_step % pl.actor_num_ranks == 0,
             f"trainer.prompts_per_step={tr.prompts_per_step} is not divisible by "
             f"placement.actor_num_ranks={pl.actor_num_ranks}: every data-parallel rank needs the same "
             f"number of prompt groups")
    _check_lora(cfg.model, tr, need)
    for group in ("sft", "trainer"):
        _check_wave_augment(cfg[group].wave_augment, f"{group}.wave_augment", need)
        _check_condition_probs(cfg[group].wave_augment.conditions, cfg.data.train_conditions,
                               f"{group}.wave_augment.conditions", need)
    for kind in ("train", "heldout"):
        for name, condition in cfg.data[f"{kind}_conditions"].items():
            _check_condition(condition, f"data.{kind}_conditions.{name}", need)
    need(cfg.data.num_heldout_conditions >= 0,
         f"data.num_heldout_conditions={cfg.data.num_heldout_conditions}: must be >= 0 (0: no held-out conditions)")
    _check_sft_warmup(cfg.sft, need)
    _check_conditions_from_step(cfg.sft, need)
    if (problem := reward_file_problem(cfg.reward)) is not None:
        problems.append(problem)
    _check_remote_reward(cfg.reward, need)
    need(cfg.reward.hang_retries >= 0, f"reward.hang_retries={cfg.reward.hang_retries}: must be >= 0")
    return problems


def choice_problems(cfg: Any) -> list[str]:
    """A value no one registered under its key, for every registry loaded (the advantage
    estimators and policy losses always are: this layer's own)."""
    import asr_grpo.algorithms  # noqa: F401  (registers them)

    problems = []
    for key, registry in loaded_registries().items():
        try:
            value = reduce(getattr, key.split("."), cfg)
        except AttributeError:   # a registry for another config (a test's own)
            continue
        if isinstance(value, str) and value not in registry:
            problems.append(registry.unknown(value))
    components = loaded_registries().get("reward.weights")   # loaded with the rewards
    if components is not None and builtin_reward(cfg.reward):
        unknown = [k for k in cfg.reward.weights if k not in components]
        if unknown:   # the built-in reward combines registered components only
            problems.append(f"reward.weights: {', '.join(unknown)}: not a reward component; "
                            f"registered: {', '.join(components.names())}")
    return problems


def builtin_reward(reward: Any) -> bool:
    """Whether the run's reward is the built-in reward file (not the user's, not a service)."""
    return not reward.reward_file and not reward.remote.urls


def _check_advantage_estimator(algo: Any, need) -> None:
    """What the chosen estimator needs: samples of one prompt, a critic, or not the KL in the reward."""
    from asr_grpo.algorithms import ADVANTAGE_ESTIMATORS

    name = algo.advantage_estimator
    if name not in ADVANTAGE_ESTIMATORS:
        return   # choice_problems said so
    estimator, n = ADVANTAGE_ESTIMATORS.get(name), algo.n_samples_per_prompt
    least = estimator.min_group_size
    if least > 1:
        need(n >= least, f"algorithm.advantage_estimator={name} compares samples of one "
                         f"prompt: algorithm.n_samples_per_prompt must be >= {least} (got {n})")
    m = algo.train_samples_per_prompt
    if m is not None:   # at most m of a group's n train: a smaller n (a quick run) trains all of its own
        need(m >= least, f"algorithm.train_samples_per_prompt={m}: must be >= {least} for "
                         f"advantage_estimator={name} (or null: train on all samples)")
    if estimator.needs_critic:
        need(algo.use_critic, f"algorithm.advantage_estimator={name} needs algorithm.use_critic=true")
    if algo.kl_in_reward and not estimator.kl_in_reward:
        able = ", ".join(k for k, e in ADVANTAGE_ESTIMATORS.items() if e.kl_in_reward)
        need(False, f"algorithm.kl_in_reward=true is only supported with advantage_estimator={able} "
                    f"(the others put the KL in the loss)")


def _check_dynamic_sampling(algo: Any, need) -> None:
    """algorithm.dynamic_sampling: a bound a step can count to, and groups whose trained
    samples can spread, under an estimator for which a flat group teaches nothing."""
    from asr_grpo.algorithms import ADVANTAGE_ESTIMATORS

    ds = algo.dynamic_sampling
    need(ds.max_extra_groups >= 0,
         f"algorithm.dynamic_sampling.max_extra_groups={ds.max_extra_groups}: must be >= 0 (0: drop, never replace)")
    if not ds.enabled:
        return
    n, m = algo.n_samples_per_prompt, algo.train_samples_per_prompt
    need(n >= 2 and (m is None or m >= 2),
         f"algorithm.dynamic_sampling.enabled=true drops groups whose rewards are all equal: it needs at least 2 "
         f"trained samples a prompt (algorithm.n_samples_per_prompt={n}, algorithm.train_samples_per_prompt={m})")
    name = algo.advantage_estimator
    if name in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS.get(name).needs_critic:
        need(False, f"algorithm.dynamic_sampling.enabled=true with algorithm.advantage_estimator={name}: a critic "
                    "gives a group of equal rewards non-zero advantages, so dropping it would drop signal; "
                    "use a group baseline (e.g. rloo, group_norm)")


def _check_policy_loss(algo: Any, tr: Any, need) -> None:
    """What the chosen policy loss needs (`PolicyLossNeeds`): sequence advantages, a kind
    of advantage estimator, whole groups in a micro-batch, or no stale-token weights."""
    from asr_grpo.algorithms import POLICY_LOSSES, policy_loss_needs
    from asr_grpo.config.schema import trained_per_group

    name = algo.policy_loss
    need(algo.gspo_eps_clip_low > 0 and algo.gspo_eps_clip_high > 0,
         f"algorithm.gspo_eps_clip_low={algo.gspo_eps_clip_low} / gspo_eps_clip_high={algo.gspo_eps_clip_high}: "
         "must be > 0")
    need(algo.mwer_logp_scale > 0, f"algorithm.mwer_logp_scale={algo.mwer_logp_scale}: must be > 0")
    if name not in POLICY_LOSSES:
        return   # choice_problems said so
    needs = policy_loss_needs(POLICY_LOSSES.get(name))
    if needs.sequence_advantages:
        need(not algo.use_critic, f"algorithm.policy_loss={name} takes one advantage per sequence and no "
                                  "critic: set algorithm.use_critic=false (and an outcome advantage_estimator)")
    if needs.estimators:
        need(algo.advantage_estimator in needs.estimators,
             f"algorithm.policy_loss={name} needs algorithm.advantage_estimator in {', '.join(needs.estimators)} "
             f"(got {algo.advantage_estimator})")
    if needs.whole_groups:
        m = trained_per_group(algo.n_samples_per_prompt, algo.train_samples_per_prompt)
        need(tr.micro_batch_by_group and tr.micro_batch_size % m == 0,
             f"algorithm.policy_loss={name} compares each group's samples within a micro-batch: needs "
             f"trainer.micro_batch_by_group=true and trainer.micro_batch_size (got {tr.micro_batch_size}) a "
             f"multiple of the {m} samples trained per group")
    if not needs.stale_is_weights:
        need(not algo.stale_is_correction,
             f"algorithm.policy_loss={name} takes no importance weights: set algorithm.stale_is_correction=false")


def _check_score_component(cfg: Any, need) -> None:
    """`algorithm.score_component` names a component the built-in reward computes (a reward
    file of one's own or a service is checked when its first result arrives)."""
    name = cfg.algorithm.score_component
    components = loaded_registries().get("reward.weights")   # loaded with the rewards
    if name is None or components is None or not builtin_reward(cfg.reward):
        return
    need(name in components, f"algorithm.score_component={name}: not a reward component; "
                             f"registered: {', '.join(components.names())}")


def _check_remote_reward(reward: Any, need) -> None:
    """reward.remote: each URL an http(s) address, and limits a client can work with."""
    from urllib.parse import urlparse

    rr = reward.remote
    for url in rr.urls:
        parts = urlparse(str(url))
        need(parts.scheme in ("http", "https") and bool(parts.netloc),
             f"reward.remote.urls: {url!r} is not an http(s) URL (e.g. http://judge:5000/score)")
    need(rr.batch_size >= 1, f"reward.remote.batch_size={rr.batch_size}: must be >= 1")
    need(rr.max_in_flight >= 1, f"reward.remote.max_in_flight={rr.max_in_flight}: must be >= 1")
    need(rr.timeout_s > 0, f"reward.remote.timeout_s={rr.timeout_s}: must be > 0")
    need(rr.retries >= 0, f"reward.remote.retries={rr.retries}: must be >= 0")
    need(0 <= rr.backoff_s <= rr.backoff_max_s,
         f"reward.remote.backoff_s={rr.backoff_s}, backoff_max_s={rr.backoff_max_s}: need 0 <= backoff_s <= "
         "backoff_max_s")
    if rr.urls and reward.reward_file:
        need(False, "reward.reward_file and reward.remote.urls are both set: a reward is either a local file or "
                    "a service (the service loads its own file: asr-grpo-reward-server --reward-file ...)")


def reward_file_problem(reward: Any) -> str | None:
    """Why `reward.reward_file` cannot work (it does not load, or its reward_func's
    signature cannot take the toolkit's call), found here rather than in a reward worker
    after Ray and the models have started. Runs the file's top level, as the worker will.
    A served reward (`reward.remote.urls`) does not use the file."""
    if not reward.reward_file or reward.remote.urls:
        return None
    try:
        load_reward_function(reward.reward_file)
    except RewardFunctionError as exc:
        return "reward.reward_file: " + " ".join(str(exc).split())   # one line, like every problem
    return None


def _check_sft_warmup(sft: Any, need) -> None:
    """A CTC warm-up trains encoder and adapter through a fresh CTC head before the LM
    trains at all: it must end before the run does, and has no place in fine-tuning."""
    warmup = sft.ctc_warmup_steps
    need(warmup < sft.max_steps or warmup == 0,
         f"sft.ctc_warmup_steps={warmup} is not below sft.max_steps={sft.max_steps}: the run would end inside "
         f"its CTC warm-up and the language model would never train (0: no warm-up)")
    if str(sft.profile) == "finetune":
        need(warmup == 0, f"sft.ctc_warmup_steps={warmup} with sft=finetune: a CTC warm-up through a fresh CTC "
                          f"head retrains the audio path of a trained model; set sft.ctc_warmup_steps=0")


def _check_conditions_from_step(sft: Any, need) -> None:
    """sft.conditions_from_step: a step the run reaches, when there are conditions to draw."""
    start = sft.conditions_from_step
    need(start >= 0, f"sft.conditions_from_step={start}: must be >= 0 (0: from the first step)")
    if any(p > 0 for p in sft.wave_augment.conditions.values()):
        need(start < sft.max_steps,
             f"sft.conditions_from_step={start} is not below sft.max_steps={sft.max_steps}: "
             f"sft.wave_augment.conditions would never be drawn")


def _check_lora(model: Any, tr: Any, need) -> None:
    """model.lora: numbers a LoRA layer can take, modules it can find, and what it cannot run with."""
    lora = model.lora
    need(lora.rank >= 0, f"model.lora.rank={lora.rank}: must be >= 0 (0: off, full fine-tuning)")
    if lora.rank <= 0:
        return
    need(lora.alpha > 0, f"model.lora.alpha={lora.alpha}: must be > 0")
    need(0 <= lora.dropout < 1, f"model.lora.dropout={lora.dropout}: must be in [0, 1)")
    names = [*lora.target_modules, *lora.encoder_target_modules]
    need(bool(names), "model.lora.target_modules and model.lora.encoder_target_modules are both empty: LoRA "
                      "needs modules to adapt (e.g. [q_proj, v_proj])")
    bad = [n for n in names if not str(n).isidentifier()]
    need(not bad, f"model.lora target modules {bad}: give module names (q_proj, fc1, ...), not paths or patterns")
    need(tr.zero_stage != 3, f"model.lora.rank={lora.rank} with trainer.zero_stage=3: not supported (ZeRO-3 "
                             "would partition the frozen base that reference and sync read); the adapters' "
                             "optimizer state is small, use trainer.zero_stage=0, 1 or 2")
    need(model.freeze_audio_encoder or bool(lora.encoder_target_modules),
         f"model.freeze_audio_encoder=false with model.lora.rank={lora.rank}: LoRA freezes every base weight, the "
         "encoder's too; adapt it with model.lora.encoder_target_modules=[q_proj, k_proj, v_proj, out_proj, fc1, fc2]")


def _ranges_ok(ranges: Any, low: float, high: float) -> bool:
    """Each [a, b] of `ranges` a pair with low <= a <= b <= high, and at least one."""
    return len(ranges) > 0 and all(len(r) == 2 and low <= r[0] <= r[1] <= high for r in ranges)


def _check_condition(c: Any, key: str, need) -> None:
    room = c.room
    if room.rt60_s:
        need(_ranges_ok(room.rt60_s, 0.1, 3.0),
             f"{key}.room.rt60_s={list(room.rt60_s)}: need [low, high] ranges with 0.1 <= low <= high <= 3 s")
        need(len(room.size_m) == 3 and _ranges_ok(room.size_m, 1.5, 50.0),
             f"{key}.room.size_m={list(room.size_m)}: need three [low, high] ranges (length, width, height) "
             f"of 1.5 to 50 m")
        need(len(room.distance_m) == 2 and 0.1 <= room.distance_m[0] <= room.distance_m[1],
             f"{key}.room.distance_m={list(room.distance_m)}: need [low, high] with 0.1 <= low <= high m")
        need(room.rooms >= 1, f"{key}.room.rooms={room.rooms}: must be >= 1")
    if c.noise.kinds:
        need(_ranges_ok(c.noise.snr_db, -20.0, 80.0),
             f"{key}.noise.snr_db={list(c.noise.snr_db)}: need [low, high] ranges with -20 <= low <= high <= 80 dB")
    if c.channel.kind != "none":
        band = list(c.channel.band_hz)
        need(len(band) == 2 and 0 < band[0] < band[1] < 4000,
             f"{key}.channel.band_hz={band}: need [low, high] with 0 < low < high < 4000 Hz (the line samples at 8 kHz)")


def _check_condition_probs(probs: Any, known: Any, key: str, need) -> None:
    for name, p in probs.items():
        need(name in known, f"{key}.{name}: no such condition in data.train_conditions "
                            f"(known: {', '.join(known) or 'none'})")
        need(0 <= p <= 1, f"{key}.{name}={p}: must be in [0, 1]")
    need(sum(probs.values()) <= 1 + 1e-9,
         f"{key}: probabilities sum to {sum(probs.values()):g}; at most one condition an utterance, so at most 1")


def _check_wave_augment(wa: Any, key: str, need) -> None:
    for name in ("speed_prob", "babble_prob"):
        need(0 <= wa[name] <= 1, f"{key}.{name}={wa[name]}: must be in [0, 1]")
    need(0.5 <= wa.speed_min <= wa.speed_max <= 2,
         f"{key}.speed_min={wa.speed_min}, speed_max={wa.speed_max}: need 0.5 <= min <= max <= 2")
    need(wa.babble_talkers >= 1, f"{key}.babble_talkers={wa.babble_talkers}: must be >= 1")
    need(wa.babble_snr_db_min <= wa.babble_snr_db_max,
         f"{key}.babble_snr_db_min={wa.babble_snr_db_min} is above babble_snr_db_max={wa.babble_snr_db_max}")


def validate_config(cfg: Any) -> None:
    problems = config_problems(cfg)
    if problems:
        listed = problems[0] if len(problems) == 1 else "\n  - " + "\n  - ".join(problems)
        raise ConfigError(f"invalid configuration: {listed}")
