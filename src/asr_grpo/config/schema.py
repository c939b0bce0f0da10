"""Typed schemas for every Hydra config group.

Each group (`conf/<group>/*.yaml`) fills one dataclass below; the root schema
`RunConfig` (shared by the RL and SFT entry points) is registered in Hydra's
ConfigStore, so a misspelt key or a value of the wrong type fails at composition
time, naming the key.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class Choice(str, Enum):
    """A config value from a fixed set. OmegaConf rejects anything else at composition,
    listing the options; a member equals (and prints as) its name, so code and MLflow
    params compare it with plain strings."""

    def __str__(self) -> str:
        return self.value


def _choice(name: str, options: str) -> type[Choice]:
    return Choice(name, [(o, o) for o in options.split()], module=__name__, qualname=name)


# The extension points (advantage estimators, policy losses, planners, rollout engines)
# are plain strings here: their choices are whatever is registered under the key
# (`config/registry.py`), checked by `config/validate.py` before a run starts.


AlgorithmName = _choice("AlgorithmName", "grpo ppo dr_grpo mwer")
KLEstimator = _choice("KLEstimator", "k1 k2 k3")
LossAgg = _choice("LossAgg", "token_mean seq_mean_token_mean seq_mean_token_sum seq_mean_token_sum_norm")
OverlapMode = _choice("OverlapMode", "none intra inter oppo")
DeltaRule = _choice("DeltaRule", "additive proportional")
SyncBackend = _choice("SyncBackend", "auto gloo nccl")
PlacementName = _choice("PlacementName", "colocate separate")
OnBadAudio = _choice("OnBadAudio", "error skip")
OnBadReward = _choice("OnBadReward", "error drop")
SmoothnessScorer = _choice("SmoothnessScorer", "rule lm")
LRScheduler = _choice("LRScheduler", "constant constant_with_warmup cosine linear")
ForecastProfile = _choice("ForecastProfile", "roofline run file")
LengthsKind = _choice("LengthsKind", "lognormal histogram")
RewardTrend = _choice("RewardTrend", "rising flat")
RunDevice = _choice("RunDevice", "auto cpu gpu")
ModelInit = _choice("ModelInit", "pretrained random")
SFTProfile = _choice("SFTProfile", "scratch finetune")
ChannelKind = _choice("ChannelKind", "none telephone")
Companding = _choice("Companding", "mulaw alaw")
NoiseKind = _choice("NoiseKind", "white pink brown hum")


@dataclass
class PathsConfig:
    # Everything the toolkit writes (corpus cache, checkpoints, MLflow store) lives here.
    output_root: str = "outputs"


@dataclass
class CorpusConfig:
    """The embedded demo corpus synthesized with eSpeak NG."""
    seed: int = 0
    num_train: int = 2000
    num_dev: int = 200
    num_test: int = 200
    num_rl: int = 2000                # RL prompts: sentences SFT never saw (0: RL uses train)
    # Evaluation split `heldout_voices`: eSpeak voices, accents, speaking rates and pitches
    # no other split uses, sentences no other split has. Drawn after every other split
    # from its own random stream, so they never change; 0 (off) leaves the corpus and
    # its hash exactly as before this key existed.
    num_heldout_voices: int = 200
    # The rl split's voices also include eSpeak variants the held-out split never uses, and
    # train only with `train_extra_variants` (with that false: RL prompts in voices SFT
    # never heard); false leaves the corpus and its hash exactly as before this key existed.
    rl_extra_variants: bool = False
    # The same variants in the train split (SFT hears 67 variants an accent instead of 45;
    # dev, test and the held-out split are unchanged). On by default: same steps, dev and
    # unseen-voice CER both lower (docs/experiments.md); false gives the 45-variant corpus.
    train_extra_variants: bool = True
    zh_fraction: float = 0.4          # share of Mandarin utterances
    long_fraction: float = 0.06       # share of long-form (8-15 s) utterances
    # Share of the rl split that is long-form dictation (several sentences of one
    # language, duration drawn in [longform_min_s, longform_max_s]): RL prompts whose
    # responses run to hundreds of tokens. train/dev/test never change; 0 (off) leaves
    # the corpus and its hash exactly as before these keys existed.
    longform_fraction: float = 0.0
    longform_min_s: float = 20.0
    longform_max_s: float = 60.0
    noise_snr_db_min: float = 25.0    # light additive noise, SNR range in dB
    noise_snr_db_max: float = 40.0
    sample_rate: int = 16000
    workers: int = 2


@dataclass
class RoomConfig:
    """A reverberant room (data/acoustics.py): a shoebox of a size drawn in `size_m`, the
    talker `distance_m` from the microphone, the reverberation time drawn in `rt60_s`.
    `rooms` such rooms are drawn once from the condition's seed; each utterance hears one."""
    rt60_s: list[list[float]] = field(default_factory=list)   # [low, high] ranges, s; empty: no room
    size_m: list[list[float]] = field(default_factory=lambda: [[3.0, 8.0], [3.0, 7.0], [2.5, 3.5]])
    distance_m: list[float] = field(default_factory=lambda: [0.5, 3.0])
    rooms: int = 32


@dataclass
class NoiseConfig:
    """Additive noise of a kind drawn from `kinds` (white, pink, brown, hum) at an SNR drawn
    in `snr_db` (one of its [low, high] ranges, in proportion to their widths)."""
    kinds: list[NoiseKind] = field(default_factory=list)   # empty: no noise
    snr_db: list[list[float]] = field(default_factory=lambda: [[10.0, 20.0]])


@dataclass
class ChannelConfig:
    """A telephone line: 8 kHz, band-passed to `band_hz`, G.711-companded (`companding`)."""
    kind: ChannelKind = ChannelKind.none
    band_hz: list[float] = field(default_factory=lambda: [300.0, 3400.0])
    companding: Companding = Companding.mulaw


@dataclass
class ConditionConfig:
    """One named acoustic condition: room, then noise, then channel (each optional)."""
    room: RoomConfig = field(default_factory=RoomConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    channel: ChannelConfig = field(default_factory=ChannelConfig)


def _condition(rt60=(), kinds=(), snr=((10.0, 20.0),), channel="none", band=(300.0, 3400.0),
               law="mulaw", distance=(0.5, 3.0)) -> ConditionConfig:
    return ConditionConfig(RoomConfig(rt60_s=[list(r) for r in rt60], distance_m=list(distance)),
                           NoiseConfig(kinds=[NoiseKind(k) for k in kinds], snr_db=[list(r) for r in snr]),
                           ChannelConfig(ChannelKind(channel), list(band), Companding(law)))


# The conditions training draws (augmentation) and the held-out ones evaluation uses: the
# held-out RT60s, SNRs and line (A-law, a narrower band) lie inside the trained envelope but
# are values no training condition draws, and the held-out rooms are other rooms.
TRAIN_CONDITIONS = {
    "room": _condition(rt60=((0.2, 0.45), (0.65, 1.0))),
    "phone": _condition(kinds=("white", "pink"), snr=((15.0, 20.0), (25.0, 35.0)), channel="telephone"),
    "noise": _condition(kinds=("white", "pink", "brown", "hum"), snr=((0.0, 5.0), (10.0, 20.0))),
}
HELDOUT_CONDITIONS = {
    "room": _condition(rt60=((0.45, 0.65),), distance=(1.0, 3.0)),
    "phone": _condition(kinds=("pink", "hum"), snr=((20.0, 25.0),), channel="telephone",
                        band=(350.0, 3200.0), law="alaw"),
    "noise": _condition(kinds=("white", "pink", "brown", "hum"), snr=((5.0, 10.0),)),
}


@dataclass
class DataConfig:
    # Manifests (JSON lines: id, audio, text, language, keywords, duration). When left
    # empty, the embedded corpus is synthesized (cached by a content hash) and used.
    train_manifest: str = ""
    dev_manifest: str = ""
    # Your own held-out-voice evaluation split (logged as eval/heldout_voices/*). Empty:
    # the corpus' heldout_voices split (none with your own train/dev/test manifests).
    heldout_voices_manifest: str = ""
    # Optional and read by neither SFT nor RL (they evaluate on dev): a record of your
    # own test set. Set alone, it is an error: train and dev are then missing.
    test_manifest: str = ""
    # The prompts RL trains on. Empty: the corpus' rl split (or, with your own
    # manifests, train_manifest).
    rl_manifest: str = ""
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    # Named acoustic conditions (docs/configuration.md#rooms-channels-and-noise): those augmentation
    # draws from (sft.wave_augment.conditions, trainer.wave_augment.conditions), and those
    # evaluated on the first `num_heldout_conditions` held-out-voice utterances, each logged as
    # eval/heldout_conditions/<name>/* ({} or 0: none).
    train_conditions: dict[str, ConditionConfig] = field(default_factory=lambda: copy.deepcopy(TRAIN_CONDITIONS))
    heldout_conditions: dict[str, ConditionConfig] = field(default_factory=lambda: copy.deepcopy(HELDOUT_CONDITIONS))
    num_heldout_conditions: int = 100
    # Seed of the condition's rooms and of each held-out utterance's draws.
    conditions_seed: int = 0
    sample_rate: int = 16000
    # Longer audio is rejected as absurd. With the embedded corpus' long-form on, the
    # limit is raised to corpus.longform_max_s: audio asked for is not absurd.
    max_duration_s: float = 30.0
    min_duration_s: float = 0.1
    on_bad_audio: OnBadAudio = OnBadAudio.error   # error: fail naming file+line; skip: skip and count
    # Language of manifest lines without `language` (NeMo: `lang`), e.g. "de"; empty:
    # such a line is a bad line.
    default_language: str = ""


# The language model's projections LoRA wraps by default (Qwen3's attention and MLP).
LM_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """LoRA adapters (PEFT) in place of full fine-tuning, in SFT and RL (`models/lora.py`).
    The base weights stay frozen; the reference policy is the base with the adapters
    switched off."""
    rank: int = 0                     # 0: off (full fine-tuning)
    alpha: float = 16.0               # scaling = alpha / rank
    dropout: float = 0.0              # on the adapters' input while training
    # Projections of the LM's decoder layers that get adapters (names, not paths: the audio
    # encoder's q/k/v_proj are left alone).
    target_modules: list[str] = field(default_factory=lambda: list(LM_PROJECTIONS))
    # Projections of the audio encoder's layers that get adapters too (e.g. [q_proj,
    # k_proj, v_proj, out_proj, fc1, fc2]); empty: the encoder stays as it is.
    encoder_target_modules: list[str] = field(default_factory=list)
    # Train the audio adapter (projector between encoder and LM) in full beside the LoRA
    # layers (PEFT's modules_to_save); the reference keeps the original.
    train_audio_adapter: bool = False


@dataclass
class ModelConfig:
    # A Qwen3-ASR checkpoint: any folder `from_pretrained` loads (save_pretrained layout,
    # processor included) or a hub id where a hub is reachable. SFT starts from it when
    # given, else from fresh weights of the architecture below; RL starts from it (the
    # RL config points it at the SFT checkpoint, which SFT builds when missing).
    path: str = ""
    # pretrained: the weights of `path`. random: fresh weights of the architecture below,
    # with a tokenizer trained on the corpus (RL at real size without SFT or a download:
    # systems benchmarks).
    init: ModelInit = ModelInit.pretrained
    freeze_audio_encoder: bool = True
    dtype: str = "float32"
    # Tiny Qwen3-ASR architecture, used when building from config.
    encoder_layers: int = 4
    encoder_d_model: int = 192
    encoder_heads: int = 4
    encoder_ffn_dim: int = 768
    encoder_downsample_hidden: int = 32
    # Seconds of audio each encoder attention window spans (Qwen3-ASR's n_window_infer,
    # in 10 ms mel frames; a multiple of its 1 s conv chunk). The encoder's positional
    # embedding restarts every chunk, so inside a wider window a from-scratch encoder
    # cannot tell the chunks apart.
    encoder_attention_window_s: int = 8
    text_layers: int = 4
    text_hidden: int = 256
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 768
    text_head_dim: int = 0            # 0: text_hidden / text_heads
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    vocab_size: int = 0               # LM vocabulary; 0: the tokenizer's size
    # Tokenizer trained locally on the corpus text (fresh weights only).
    tokenizer_vocab_size: int = 1200
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class SpecAugmentConfig:
    """SFT-only SpecAugment masks (asr_grpo.data.augment)."""
    enabled: bool = False
    freq_masks: int = 2            # masks per utterance over the mel bins
    freq_width: int = 20           # each at most this many bins wide (of 128)
    time_masks: int = 2            # masks per utterance over frames
    time_width_frac: float = 0.05  # each at most this fraction of the utterance's frames


@dataclass
class WaveAugmentConfig:
    """Waveform perturbation (asr_grpo.data.augment), drawn anew every step: SFT's
    (sft.wave_augment) and the RL prompts' (trainer.wave_augment, off by default)."""
    speed_prob: float = 0.5        # share of utterances speed-perturbed (tempo and pitch together)
    speed_min: float = 0.85        # factor range: 0.85 = 15% slower and lower
    speed_max: float = 1.15
    babble_prob: float = 0.3       # share of utterances mixed with other utterances of the batch
    babble_talkers: int = 3        # 1..this many talkers under one utterance
    babble_snr_db_min: float = 10.0
    babble_snr_db_max: float = 25.0
    # Probability of each named condition of data.train_conditions (at most one an utterance,
    # so they sum to at most 1), after speed and babble: room, noise, line.
    conditions: dict[str, float] = field(default_factory=dict)


@dataclass
class SFTConfig:
    # scratch (sft=default): the recipe for fresh weights (CTC warm-up, high LR, trainable
    # encoder, perturbation); finetune (sft=finetune): for a trained start (docs/configuration.md).
    profile: SFTProfile = SFTProfile.scratch
    output_dir: str = "${paths.output_root}/checkpoints/sft-tiny"
    max_minutes: float = 19.0         # wall-clock cap; the LR schedule follows max_steps
    max_steps: int = 2400
    batch_size: int = 16
    max_batch_seconds: float = 64.0   # padded audio seconds per batch (size x longest)
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    warmup_steps: int = 100
    grad_clip: float = 1.0
    # Weight of an auxiliary CTC loss on the adapter's audio frames in the steps after
    # the CTC warm-up (SFT only; the CTC head is not saved).
    ctc_weight: float = 0.0
    # The first N steps train only encoder + adapter + CTC head on the CTC loss (no LM
    # forward, ~1.6x cheaper a step): the LM then starts from audio frames that already
    # tell the tokens apart, instead of learning to listen while the encoder learns to
    # hear. 400 of 1,650 steps: dev CER 40.2% -> 23.1% in the same 19 minutes (14-voice corpus).
    ctc_warmup_steps: int = 500
    # Fraction of the teacher-forced transcript tokens replaced in the decoder's input by
    # other tokens of the batch (labels unchanged): with its own history unreliable, the
    # decoder has to take more of each token from the audio than from its language model.
    input_token_dropout: float = 0.0
    train_audio_encoder: bool = True   # false: the encoder frozen (adapter and LM train)
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    wave_augment: WaveAugmentConfig = field(
        default_factory=lambda: WaveAugmentConfig(conditions={"room": 0.0, "phone": 0.0, "noise": 0.0}))
    # The first N steps hear no wave_augment.conditions: the model learns to read clean
    # speech before rooms, lines and noise are mixed in (0: from the first step).
    conditions_from_step: int = 0
    shortest_first_epoch: bool = True   # SortaGrad: the first epoch in increasing length
    eval_every_steps: int = 0
    eval_max_utterances: int = 100
    eval_batch_size: int = 32
    num_threads: int = 2
    max_new_tokens: int = 96
    seed: int = 0


@dataclass
class PlacementConfig:
    name: PlacementName = PlacementName.colocate
    colocate: bool = True
    num_nodes: int = 1
    gpus_per_node: int = 2            # logical GPUs on CPU machines (Ray custom count)
    use_logical_gpus: bool = True     # declare logical GPU resources on CPU-only hosts
    actor_gpus: float = 0.75          # fraction per actor rank when colocated
    ref_gpus: float = 0.1
    critic_gpus: float = 0.1
    reward_model_gpus: float = 0.05   # the text LM of reward.smoothness_scorer=lm
    reward_gpus: float = 0.0
    rollout_gpus: float = 0.25
    actor_num_ranks: int = 1
    rollout_num_workers: int = 1
    reward_num_workers: int = 1
    # "": join $RAY_ADDRESS when set (`ray job submit` sets it for the driver), else start a
    # local Ray; "local": always a local Ray; "auto" or an address: ray.init(address=...).
    ray_address: str = ""
    # Ray CPUs reserved per rank of each role (its actor's num_cpus; a GPU rank's bundle
    # reserves them); roles not named keep these defaults.
    role_cpus: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ROLE_CPUS))


# The model roles reserve no CPU: with trainer.num_threads=auto they share the node's cores
# phase by phase (workers/threads.py), which a fixed reservation would only cap (a role given
# N >= 1 CPUs runs N torch threads in every phase). A reward worker is a single-threaded
# Python process busy through the scoring phase: one core. The default run (actor,
# reference, one reward worker) reserves 1 CPU and fits a 2-core laptop.
DEFAULT_ROLE_CPUS = {"actor": 0.0, "ref": 0.0, "critic": 0.0, "reward_model": 0.0, "reward": 1.0, "rollout": 0.0}


def trained_per_group(n: int, m: int | None) -> int:
    """How many of a group's n samples train under `algorithm.train_samples_per_prompt=m`:
    at most m (None: all), so a run sampling fewer than m trains all of its own. Here,
    beside the setting, so the forecast reads it without loading the tensor code."""
    return min(m or n, n)


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling: a finished prompt group whose rewards are all equal
    (a zero advantage for every sample under a group baseline) does not count toward the
    step's B groups; the scheduler admits another prompt group in its place."""
    enabled: bool = False
    # The most replacement groups a step may draw; past it the step trains the groups
    # that spread (fewer than B). 8: one more batch at trainer.prompts_per_step=8.
    max_extra_groups: int = 8


@dataclass
class AlgorithmConfig:
    name: AlgorithmName = AlgorithmName.grpo
    advantage_estimator: str = "rloo"   # algorithms/advantages.py: ADVANTAGE_ESTIMATORS
    n_samples_per_prompt: int = 32
    # Train on at most this many of each prompt's n samples, those whose rewards spread most
    # (max-variance down-sampling: decoding is cheap next to training); null: all n.
    train_samples_per_prompt: Optional[int] = 8
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.01
    kl_estimator: KLEstimator = KLEstimator.k3
    kl_in_reward: bool = False        # False: KL as a loss term (GRPO style)
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28
    dual_clip: Optional[float] = 3.0
    value_clip: float = 0.2
    policy_loss: str = "ppo_clip"       # algorithms/losses.py: POLICY_LOSSES
    # GSPO's sequence-ratio clip range (policy_loss=gspo | gspo_token): the length-normalised
    # ratio moves far less than a token's, so its range is ~1000x smaller (the paper's values).
    gspo_eps_clip_low: float = 3e-4
    gspo_eps_clip_high: float = 4e-4
    # policy_loss=mwer: p_i = softmax over the group of this x the sequence log-prob (1: the
    # textbook MWER; < 1 flattens a distribution one hypothesis would otherwise take whole).
    mwer_logp_scale: float = 1.0
    # seq_mean_token_sum_norm divides by the constant max_new_tokens (Dr. GRPO).
    loss_agg: LossAgg = LossAgg.token_mean
    entropy_coef: float = 0.0
    use_critic: bool = False
    # The advantages (and down-sampling) read this reward component instead of the reward's
    # total; null: the total. algorithm=mwer: cer (1 - min(CER, 1)), so err = 1 - score.
    score_component: Optional[str] = None
    temperature: float = 0.8
    top_p: float = 1.0
    max_new_tokens: int = 96
    # False: a sequence sampled wholly by the current weights keeps the rollout's own
    # (behaviour) log-probs as its old log-probs instead of a second actor forward; the
    # HF engine's equal that forward to float rounding. Sequences holding tokens of older
    # weights (carried by overcommit) are still recomputed.
    recompute_old_logprobs: bool = True
    # Tokens decoded by an older policy (carried into a later step by overcommit) get
    # truncated importance weights pi_old / pi_behaviour, capped at stale_is_clip.
    stale_is_correction: bool = False
    stale_is_clip: float = 2.0
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)


@dataclass
class OverlapConfig:
    mode: OverlapMode = OverlapMode.none
    # How each step's chunk (intra, oppo) and Δ (inter, oppo) are chosen. cost_model:
    # fitted from the run's own timings, least predicted time per trained sample (serial
    # unless overlap pays); trial: the OPPO paper's periodic chunk trials + reward-slope
    # Δ; fixed: chunk_size and delta_init every step (the forced ablation).
    controller: str = "cost_model"      # overlap/planners.py: PLANNERS
    # Overcommit: the hosts check "B groups finished?" every this many decode rounds,
    # whatever the chunk size (which only sets how often tokens stream to the scorers).
    stop_check_every: int = 1
    chunk_size: int = 16              # fixed: the chunk; trial: the size before its first round
    chunk_candidates: list[int] = field(default_factory=lambda: [0, 8, 16, 32])   # 0: no streaming
    chunk_trial_period: int = 20      # trial: every P steps a round tries each candidate
    chunk_trial_warmup: int = 1       # trial: steps before the first round (start-up costs skew them)
    chunk_trial_steps: int = 3        # trial: steps per candidate in a round (the median decides)
    cost_model_warmup: int = 3        # cost_model: serial steps that fit the costs before it plans
    cost_model_margin: float = 0.03   # cost_model: overlap only when predicted faster by this share
    delta_init: int = 0
    delta_min: int = 0
    delta_max: int = 4
    delta_inc: int = 1
    delta_dec: int = 1
    delta_window: int = 5
    delta_rule: DeltaRule = DeltaRule.additive   # proportional: steps of max(1, floor(Δ/4))
    # os.nice() of the scorer roles (reference, critic, LM reward model): where they
    # share cores with the actor, its decode (the critical path) runs first.
    scorer_nice: int = 5
    # An MLflow run id: replay that run's recorded per-step plans (chunk, Δ) instead of
    # planning; with the same seed and config the run repeats the original step for step.
    replay_plan: str = ""


@dataclass
class RolloutConfig:
    """The engine that samples the rollouts (`conf/rollout/`)."""
    # hf: the policy's own forward (colocated: the actor ranks decode; separate: HF
    # rollout workers). vllm: vLLM engines as their own Ray actors (GPU machines; the
    # `vllm` extra), one per placement.rollout_num_workers, weights synced from the
    # trainer after every update. Colocated, an engine shares rank i's bundle.
    engine: str = "hf"                # workers/rollout.py: ROLLOUT_ENGINES
    tensor_parallel_size: int = 1     # GPUs (placement bundles) per vLLM engine
    dtype: str = "${model.dtype}"     # vLLM's dtype ("auto" would turn float32 into float16)
    gpu_memory_utilization: float = 0.3   # share of the GPU's memory vLLM may take
    enable_prefix_caching: bool = True    # continuations find prompt + partial tokens cached
    # KV block (tokens); 0: vLLM's default (16 on CUDA, 128 on the CPU build). Only whole
    # blocks are cached, so a prompt shorter than one block is never found again.
    block_size: int = 0
    enforce_eager: bool = False       # true: no CUDA graphs (faster start, slower decode)
    max_num_seqs: int = 256           # sequences vLLM schedules together
    max_model_len: int = 0            # 0: the model's max_position_embeddings
    sleep_level: int = 0              # colocated: 1|2 = vLLM sleeps while the trainer trains
    # auto: gloo when colocated (NCCL refuses 2 ranks on 1 GPU), else nccl on CUDA
    sync_backend: SyncBackend = SyncBackend.auto
    export_dir: str = "${paths.output_root}/checkpoints/vllm"   # vLLM-layout copies of model.path
    # The weight-sync check (engines in workers of their own: rollout=vllm or placement=separate):
    # every N-th sync, each engine scores `sync_check_sequences` just-trained samples and must
    # match the trainer's log-probs within `sync_check_tol` (float32; bf16 needs ~5e-2). 0: off.
    sync_check_every: int = 0
    sync_check_sequences: int = 4
    sync_check_tol: float = 1e-3
    # How long a weight push may wait on a member of the sync group: a rollout worker lost
    # mid-push ends the others' wait by then; it is restarted and the push made again.
    weight_sync_timeout_s: float = 60.0


@dataclass
class RemoteRewardConfig:
    """A reward served over HTTP (OpenRLHF's remote reward contract); `urls` empty: off."""
    urls: list[str] = field(default_factory=list)   # POST targets, load-balanced (least in flight)
    batch_size: int = 32          # sequences per request
    max_in_flight: int = 8        # requests in flight at once, over all URLs
    timeout_s: float = 30.0       # per request (connect + answer)
    retries: int = 5              # after the first try, on connection errors, timeouts, 408, 429, 5xx
    backoff_s: float = 0.2        # first retry's mean wait; doubles each retry (full jitter)
    backoff_max_s: float = 10.0   # no retry waits longer (a 429's Retry-After is honoured up to this)
    # intra/oppo: send each sequence as it finishes, while the rollout decodes (off: the
    # whole batch after the rollout). With the service on another machine it gained 79.7%
    # of what a perfect pipeline could on 2 CPU cores (docs/overlap.md#measured).
    feed: bool = True
    # With `feed`: how often at most a decoding host sends what finished to a reward
    # worker (each goes out within about this of its last token).
    feed_every_s: float = 0.05


@dataclass
class RewardConfig:
    # A Python file defining reward_func(queries, prompts, labels, **kwargs).
    # Empty: the built-in ASR reward file shipped with the package.
    reward_file: str = ""
    weights: dict[str, float] = field(default_factory=lambda: {
        "cer": 1.0, "keyword": 0.3, "language": 0.2, "smoothness": 0.2})
    smoothness_scorer: SmoothnessScorer = SmoothnessScorer.rule
    # smoothness_scorer=lm: a tiny Qwen3 text LM over the ASR tokenizer, trained on the
    # train-split transcripts at set-up (asr_grpo.models.text_lm) and cached here;
    # retrained when the tokenizer, the texts or these settings change.
    text_lm_dir: str = "${paths.output_root}/checkpoints/text-lm"
    text_lm_hidden: int = 96
    text_lm_layers: int = 2
    text_lm_intermediate: int = 256
    text_lm_steps: int = 300
    text_lm_batch_size: int = 32
    text_lm_lr: float = 3e-3
    text_lm_seed: int = 0
    timeout_s: float = 30.0
    # A reward_func call that hangs past timeout_s is tried again this many times (a stall in
    # what it calls out to can pass) before on_bad_reward decides.
    hang_retries: int = 1
    on_bad_reward: OnBadReward = OnBadReward.error
    # The reward served over HTTP instead of reward_file (reward=remote sets urls).
    remote: RemoteRewardConfig = field(default_factory=RemoteRewardConfig)


@dataclass
class TrainerConfig:
    steps: int = 100
    max_minutes: float | None = None  # wall-clock cap on the training loop: ends early, evaluated and saved
    prompts_per_step: int = 8         # B, in prompt groups
    train_epochs: int = 1
    micro_batch_size: int = 16
    # true: a micro-batch holds whole groups (shuffled by group), so the training forward runs each
    # prompt once for its samples (2-3x cheaper on CPU); false: samples shuffled one by one
    micro_batch_by_group: bool = True
    rollout_batch_size: int = 64      # sequences decoded together by one engine
    grad_accum_steps: int = 1
    lr: float = 5e-5
    critic_lr: float = 1e-4
    lr_warmup_steps: int = 5
    lr_scheduler: LRScheduler = LRScheduler.constant_with_warmup
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    zero_stage: int = 1
    # > 0: the policy also keeps an exponential moving average of its trained weights (this decay
    # per RL step, warmed up as min(decay, (1 + t) / (10 + t)) unless ema_warmup=false); evaluation
    # logs it as `eval/ema/...` beside the policy's own `eval/...`, and each checkpoint writes it
    # as `hf_ema/`. 0: off
    ema_decay: float = 0.0
    # false: every update uses ema_decay from the first (a longer window late in a run, the
    # starting weights' share fading as ema_decay ** t)
    ema_warmup: bool = True
    gradient_checkpointing: bool = False   # recompute activations in backward (policy and critic)
    # torch threads per role rank. auto: follow the phase of the step (a rank computing alone takes
    # its node's cores, ranks computing side by side split them); an integer pins every phase.
    num_threads: int | str = "auto"
    # 200 utterances every 50 steps: about what 100 every 20 cost, with less sampling noise in each
    # evaluation (100 left a 100-step run's CER change inside it)
    eval_every: int = 50
    eval_max_utterances: int = 200
    save_every: int = 20
    keep_last: int = 0                # step checkpoints kept (the newest); 0: all
    resume: bool = False
    output_dir: str = "${paths.output_root}/checkpoints/rl"
    # SIGTERM or SIGINT on the driver: the step in flight may finish for this many seconds (then it
    # is abandoned), its checkpoint is written and the run ends with the resume command. Keep it below
    # the scheduler's kill grace (Slurm KillWait, Kubernetes terminationGracePeriodSeconds: 30 s) less
    # the time a checkpoint and Ray's shutdown take
    stop_grace_s: float = 20.0
    # RL prompts' audio perturbed once a group (all its samples hear the same audio) from a seed
    # of the run's seed and the prompt's draw, so a resumed run hears what the uninterrupted one did
    wave_augment: WaveAugmentConfig = field(default_factory=lambda: WaveAugmentConfig(
        speed_prob=0.0, babble_prob=0.0, conditions={"room": 0.0, "phone": 0.0, "noise": 0.0}))


@dataclass
class LoggerConfig:
    tracking_uri: str = "sqlite:///${paths.output_root}/mlflow.db"
    experiment_name: str = "asr-grpo"
    run_name: str = ""
    log_system_metrics: bool = True
    system_metrics_interval_s: float = 10.0   # MLflow system metrics (CPU, memory, GPU) sampling period
    # Metrics logged in MLflow's background thread (`synchronous=False`), so the loop does not wait for
    # the store, and a tracking server that is down is retried while training goes on (MLflow's HTTP
    # retries, MLFLOW_HTTP_REQUEST_MAX_RETRIES: about 4 min by default). null: on for an http(s) server,
    # off for a local store
    async_logging: Optional[bool] = None
    # steps whose metrics may be in flight at once; past it the loop waits for the oldest (the memory
    # bound while a server is down)
    async_max_pending: int = 1000


@dataclass
class RunConfig:
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0


@dataclass
class InitConfig:
    """`python -m asr_grpo.init_checkpoint` (conf/init.yaml): a Qwen3-ASR checkpoint of the
    model group's architecture with fresh weights, its tokenizer and processor, written
    without a model hub; `from_pretrained` loads it and SFT (sft=default) starts from it."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    data: DataConfig = field(default_factory=DataConfig)   # the corpus whose text trains the tokenizer
    model: ModelConfig = field(default_factory=ModelConfig)
    output_dir: str = "${paths.output_root}/checkpoints/init"
    # A folder holding a Qwen3-ASR tokenizer to use as it is (its audio and chat tokens
    # checked); "": train one (model.tokenizer_vocab_size) on `text`.
    tokenizer: str = ""
    # Text files (one utterance a line) or JSONL manifests (their `text`) to train the
    # tokenizer on; empty: the training split of `data` (the demo corpus, built if needed).
    text: list[str] = field(default_factory=list)
    languages: list[str] = field(default_factory=lambda: ["en", "zh"])   # of plain text files
    seed: int = 0


@dataclass
class CompareConfig:
    """`python -m asr_grpo.compare` (conf/compare.yaml): the speedup report over MLflow runs.
    Pick runs by `run_ids`, or `sweep` (a sweep tag, "latest" = the newest), or
    `experiment_name` alone (all its RL runs); nothing = the latest sweep."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    tracking_uri: str = "sqlite:///${paths.output_root}/mlflow.db"   # or a server: http://127.0.0.1:5000
    sweep: Optional[str] = None
    experiment_name: Optional[str] = None   # with sweep: look for it only here
    run_ids: list[str] = field(default_factory=list)
    output_dir: str = ""              # "": <paths.output_root>/reports/<sweep tag or selection>
    window: int = 3                   # steps in the reward smoothing window
    target_frac: float = 0.98         # reward target = frac x baseline's final; CER target = (2 - frac) x
    target_reward: Optional[float] = None   # absolute targets instead (same for every run)
    target_cer: Optional[float] = None
    plots: bool = True
    log_to_mlflow: bool = True        # report/ artifacts on the sweep's parent run (or a new compare run)
    register_best: bool = True        # log the best run's HF checkpoint and register it as a model version
    model_name: str = "asr-grpo-rl"


# ---- the forecast: `python -m asr_grpo.forecast` (conf/forecast.yaml) ----------------------------


@dataclass
class ForecastGpuConfig:
    """One GPU's public peak figures and the efficiencies the roofline assumes (conf/forecast_gpu)."""
    name: str = "h100"
    hbm_bandwidth_GBps: float = 3350.0   # peak HBM bandwidth
    bf16_dense_tflops: float = 989.0     # peak dense bf16 tensor-core FLOP/s (no sparsity)
    memory_GB: float = 80.0
    interconnect_GBps: float = 450.0     # NVLink, one direction, per GPU (weight sync, gradient all-reduce)
    mem_efficiency: float = 0.8          # share of peak bandwidth a decode round reaches
    flop_efficiency: float = 0.5         # share of peak FLOP/s a prefill or scoring forward reaches
    train_efficiency: float = 0.4        # share of peak FLOP/s forward + backward reaches (MFU)
    round_overhead_s: float = 0.002      # per decode round beyond the roofline: launches, sampling, scheduling
    call_overhead_s: float = 0.003       # per forward call outside the decode loop (launch, actor call)


@dataclass
class ForecastModelConfig:
    """A decoder's shape (conf/forecast_model): what the roofline reads and writes per token."""
    name: str = "qwen3_asr_1p7b"
    layers: int = 28
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 6144
    vocab: int = 151936
    tie_embeddings: bool = True
    audio_encoder_params: float = 0.0    # frozen audio encoder: runs once per prompt, at prefill
    dtype_bytes: int = 2                 # bf16 weights and KV cache
    source: str = ""


@dataclass
class ForecastPlacementConfig:
    """Which device group each role computes on (conf/forecast_placement). Roles that share
    a group take turns on it, except streamed scoring during the decode (`stream_hidden`)."""
    name: str = "colocate"
    devices: dict[str, int] = field(default_factory=lambda: {"gpu": 8})   # device group -> GPUs
    rollout: str = "gpu"         # where the rollout engines decode (actor group: hybrid engine)
    engine_gpus: int = 1         # GPUs per rollout engine (tensor parallel)
    actor: str = "gpu"           # training and old log-probs
    ref: str = "gpu"             # "": no reference model
    critic: str = ""             # "": no critic (GRPO, or a value head sharing the actor's backbone)
    reward_model: str = ""       # "": rule rewards only
    stream: list[str] = field(default_factory=lambda: ["ref", "critic", "reward_model"])   # intra/oppo stream to these
    # Ray GPU fractions of the run's layout (conf/placement): which roles share a GPU. A
    # fraction is bookkeeping, not a throughput share: roles on one GPU take turns.
    fractions: dict[str, float] = field(default_factory=lambda: {"actor": 0.75, "ref": 0.25})
    stream_hidden: Optional[float] = None   # share of a colocated scorer's streamed work the decode hides; None: 0.5
    decode_call_s: float = 0.002            # driver -> engine round trip per decode call
    reward_per_sample_s: float = 0.0002     # rule rewards (CPU) per sample: CER, keywords, language, smoothness
    step_fixed_s: float = 0.05              # driver work per step outside the phases


@dataclass
class ForecastWorkloadConfig:
    """The RL step's sizes (conf/forecast_workload)."""
    name: str = "asr_grpo"
    prompts_per_step: int = 32           # B, in prompt groups
    n_samples: int = 8                   # samples per prompt
    train_samples: Optional[int] = None  # of which train (algorithm.train_samples_per_prompt); null: all
    max_new_tokens: int = 256
    prompt_text_tokens: int = 32         # system turn, language tag
    audio_tokens_per_token: float = 4.0  # ASR: audio prompt tokens per transcript token (12.5 Hz, ~3 tok/s)
    train_epochs: int = 1
    recompute_old_logprobs: bool = True


@dataclass
class ForecastLengthComponent:
    weight: float = 1.0
    median: float = 20.0                 # tokens
    sigma: float = 0.5                   # of log length, across prompts


@dataclass
class ForecastLengthsConfig:
    """Response lengths (conf/forecast_lengths): a lognormal mixture per prompt, with the
    samples of one prompt spread around its length; or a histogram file."""
    name: str = "asr_short"
    kind: LengthsKind = LengthsKind.lognormal
    components: list[ForecastLengthComponent] = field(default_factory=lambda: [ForecastLengthComponent()])
    sample_sigma: float = 0.05           # of log length, between the samples of one prompt
    path: str = ""                       # histogram: JSON list of lengths (or of groups' lengths), or one per line
    from_run: bool = True                # profile=run: the run's own distribution instead


@dataclass
class ForecastRunSourceConfig:
    """profile=run: the `overlap=none` run to fit (an MLflow run, or a benchmark summary JSON)."""
    run_id: str = ""
    tracking_uri: str = "sqlite:///${paths.output_root}/mlflow.db"
    summary_json: str = ""               # instead: bench/overlap_speedup-style JSON with a `none` run summary
    workload: str = ""                   # which workload of that JSON ("": the first)
    skip_steps: int = 1                  # first steps pay start-up costs
    device: RunDevice = RunDevice.auto   # auto: gpu when the run logged system/gpu_* metrics
    stream_call_s: float = 0.005         # a streaming scorer call's fixed cost (not in a serial run)
    prompt_tokens: int = 64              # prompt tokens per group (re-prefill cost of carried tokens)
    round_fixed_share: float = 0.12      # prior: fixed share of a median round, when the steps cannot tell (CPU: 12%)


@dataclass
class ForecastConfig:
    """`python -m asr_grpo.forecast`: OPPO's step time for every overlap mode, from the
    real scheduler driving simulated hosts, scorers and trainer on a virtual clock."""
    paths: PathsConfig = field(default_factory=PathsConfig)
    profile: ForecastProfile = ForecastProfile.roofline
    cost_file: str = ""                  # profile=file: a JSON cost table (bench/gpu_profile.sh writes one)
    run: ForecastRunSourceConfig = field(default_factory=ForecastRunSourceConfig)
    gpu: ForecastGpuConfig = field(default_factory=ForecastGpuConfig)
    model: ForecastModelConfig = field(default_factory=ForecastModelConfig)
    reward_model: ForecastModelConfig = field(default_factory=ForecastModelConfig)
    placement: ForecastPlacementConfig = field(default_factory=ForecastPlacementConfig)
    workload: ForecastWorkloadConfig = field(default_factory=ForecastWorkloadConfig)
    lengths: ForecastLengthsConfig = field(default_factory=ForecastLengthsConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)   # every mode's knobs; the mode is set per run
    modes: list[str] = field(default_factory=lambda: ["none", "intra", "inter", "oppo"])
    steps: int = 40                      # simulated steps per mode
    warmup: int = 8                      # first steps left out of the figures (buffer filling, planner warm-up)
    reward_trend: RewardTrend = RewardTrend.rising   # the mean reward the Δ controllers see
    seed: int = 0
    json: str = ""                       # also write the figures here
    output_dir: str = ""                 # "": <paths.output_root>/forecast/<time>
    plot: bool = True
    log_to_mlflow: bool = True
    logger: LoggerConfig = field(default_factory=LoggerConfig)
