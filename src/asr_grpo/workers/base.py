"""What every model-holding role shares: config, threads, scoring a batch of sequences."""
from __future__ import annotations

import contextlib
import functools
import math
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from asr_grpo.config.schema import RunConfig
from asr_grpo.distributed.placement import role_counts
from asr_grpo.models import load_model
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import score_once, token_logprobs
from asr_grpo.tracking import BusyClock


def as_config(cfg: Any) -> RunConfig | DictConfig:
    """Roles receive the run config as a plain dict (Ray pickles it); rebuild the typed node."""
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)


def seed_rngs(seed: int) -> None:
    """Seed the process-wide torch, numpy and Python RNGs (a role's are then the same in
    every run with the same seed, and a resume puts them back from the checkpoint)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """The RNG streams as tensors and plain values only, so the checkpoint loads weights-only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
            "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next]}


def set_rng_state(state: dict | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))


def role_device() -> torch.device:
    """Where this role's model runs: its GPU when Ray gave it one (Ray sets
    CUDA_VISIBLE_DEVICES to the actor's own devices, so that GPU is index 0), else CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def join_process_group() -> int:
    """Join the role's data-parallel group from the env vars its RoleGroup set; returns the rank."""
    from asr_grpo.distributed.deepspeed_strategy import init_distributed

    rank = int(os.environ["RANK"])
    init_distributed(rank, int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                     int(os.environ["MASTER_PORT"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    return rank


# ---- torch threads per phase of the step ----------------------------------------------
# A step runs in phases, and what runs side by side differs per phase: the policy decodes
# and evaluates alone ("solo"), trains beside the critic if there is one ("train"), and
# scores beside the reference, critic and reward model ("shared"; streaming scorers run
# beside the decode). Model roles reserve no cores by default (placement.role_cpus: num_cpus=0,
# so Ray sets OMP_NUM_THREADS=1 in them): with trainer.num_threads=auto each call takes the
# node's cores divided by the ranks running side by side in its phase (a role given N >= 1
# CPUs runs N threads in every phase). A thread team is fragile
# when other jobs share the cores unless OpenMP stops spin-waiting soon: libgomp reads
# GOMP_SPINCOUNT / OMP_WAIT_POLICY at start-up only, so they must be in the actor's
# environment (bench/results/thread_phases.json).
PHASES = ("solo", "train", "shared")


def node_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by the Ray node's CPU count
    (which sees a container's CPU quota, or a node started with --num-cpus)."""
    cores = len(os.sched_getaffinity(0))
    cpus = _ray_node_cpus()
    return max(1, min(cores, cpus) if cpus >= 1 else cores)


def _ray_node_cpus() -> int:
    """The CPU resource of the Ray node this process runs on (0: not in Ray)."""
    import ray

    if not ray.is_initialized():
        return 0
    node = ray.get_runtime_context().get_node_id()
    return int(next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0))


def reserved_cpus() -> int:
    """CPUs Ray reserved for this actor (0: none, the model roles' default placement.role_cpus)."""
    import ray

    return int(ray.get_runtime_context().get_assigned_resources().get("CPU", 0)) if ray.is_initialized() else 0


def side_by_side(cfg, world_size: int) -> dict[str, int]:
    """Per phase, the model-role ranks that compute at once on one node (ranks spread
    evenly over placement.num_nodes; the roles are those rl.py starts for this config).
    The policy counts among the scorers: it scores old log-probs, or decodes beside the
    streaming scorers."""
    counts = role_counts(cfg.placement, use_critic=cfg.algorithm.use_critic, use_ref=cfg.algorithm.kl_coef > 0,
                         use_reward_model=cfg.reward.smoothness_scorer == "lm")
    nodes = max(1, int(cfg.placement.num_nodes))
    here = {role: math.ceil(n / nodes) for role, n in counts.items()}
    return {"solo": math.ceil(world_size / nodes), "train": here["actor"] + here["critic"],
            "shared": here["actor"] + here["ref"] + here["critic"] + here["reward_model"]}


def phase_threads(cfg, world_size: int = 1, *, cores: int | None = None, reserved: int = 0,
                  on_gpu: bool = False) -> dict[str, int]:
    """torch threads per phase. An integer trainer.num_threads pins every phase; `auto`
    splits the node's cores among the ranks of each phase. Cores Ray reserved for the
    actor are its own in every phase. On a GPU the compute is not on these threads: every
    phase takes the scoring share, which never oversubscribes the host."""
    pinned = cfg.trainer.num_threads
    if pinned != "auto":
        if not isinstance(pinned, int) or isinstance(pinned, bool) or pinned < 1:
            raise ValueError(f"trainer.num_threads must be 'auto' or an integer >= 1, got {pinned!r}")
        return dict.fromkeys(PHASES, pinned)
    if reserved >= 1:
        return dict.fromkeys(PHASES, reserved)
    cores = node_cores() if cores is None else cores
    ranks = side_by_side(cfg, world_size)
    share = {p: max(1, cores // max(1, ranks[p])) for p in PHASES}
    return dict.fromkeys(PHASES, share["shared"]) if on_gpu else share


def phase(name: str):
    """Decorator: run a role method with `self.threads(name)` (objects without thread
    control, such as the forecast's simulated hosts, run as they are)."""
    if name not in PHASES:
        raise ValueError(f"unknown thread phase {name!r}; phases: {PHASES}")

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            threads = getattr(self, "threads", None)
            with threads(name) if threads is not None else contextlib.nullcontext():
                return method(self, *args, **kwargs)
        run.thread_phase = name   # kept by outer functools.wraps (busy): tests read it
        return run
    return wrap


class ModelRole(BusyClock):
    """Base of the policy, reference, critic and rollout roles."""

    def __init__(self, cfg: Any):
        self.cfg = as_config(cfg)
        seed_rngs(self.cfg.seed + int(os.environ.get("RANK", 0)))
        self.phase_threads = phase_threads(self.cfg, int(os.environ.get("WORLD_SIZE", "1")),
                                           reserved=reserved_cpus(), on_gpu=role_device().type == "cuda")
        # Roles start side by side: load the models on the scoring share.
        torch.set_num_threads(self.phase_threads["shared"])
        # Keep tokenizers from spawning their own pool inside a 1-thread actor.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.pad_id = 0

    @contextlib.contextmanager
    def threads(self, name: str) -> Iterator[int]:
        """torch threads for one phase of the step (see PHASES); the count before is put
        back after. torch.set_num_threads acts on the calling thread's OpenMP pool, so it
        is set here, in the method, not once at start-up."""
        n = self.phase_threads[name]
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield n
        finally:
            torch.set_num_threads(before)

    def load_frozen_model(self) -> tuple[torch.nn.Module, int]:
        """model.path's model on this role's device, for inference only, and its pad id."""
        model, processor = load_model(self.cfg.model.path, self.cfg.model.dtype)
        return model.to(role_device()).eval().requires_grad_(False), processor.tokenizer.pad_token_id

    def engine_trainer_cfg(self):
        """trainer config for `TrainingEngine`, which wants a thread count: the training
        phase's (the roles' `threads` then set every phase per call)."""
        trainer = self.cfg.trainer.copy()
        trainer.num_threads = self.phase_threads["train"]
        return trainer

    @torch.no_grad()
    def _logprobs(self, model, items: Sequence, micro_batch: int,
                  temperature: float | None = None) -> list[torch.Tensor]:
        """Per-token log-probs of finished sequences, under the sampling temperature
        (`algorithm.temperature`) unless `temperature` is given (the sync check's 1.0)."""
        return self._score_sequences(lambda: causal_lm_forward(model), token_logprobs(self._temperature(temperature)),
                                     items, micro_batch)

    def _temperature(self, temperature: float | None) -> float:
        """The temperature fixed sequences are scored at: the sampling one unless given."""
        return self.cfg.algorithm.temperature if temperature is None else temperature

    def _score_sequences(self, forward, score, items: Sequence, micro_batch: int) -> list[torch.Tensor]:
        """Per-token scores of finished sequences (`SequenceRef`s), `micro_batch`
        sequences' KV caches at a time; the samples of one prompt share its prefill."""
        return score_once(forward, self.pad_id, score, [it.uid for it in items], [it.prompt_ids for it in items],
                          [it.features for it in items], [it.response_ids for it in items],
                          max_batch_size=max(micro_batch, 1))
