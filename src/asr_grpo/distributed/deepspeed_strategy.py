"""DeepSpeed data-parallel training for one model role (actor, critic).

`init_distributed` joins the default (DeepSpeed) process group from the env vars a
launcher or Ray actor would set; `deepspeed_config` turns a `TrainerConfig` into a
validated DeepSpeed config; `TrainingEngine` wraps `deepspeed.initialize` with AdamW
over the trainable parameters only and an HF LR schedule.

Precision (`trained_precision`): `model.dtype=bfloat16` trains in DeepSpeed's bf16 mode,
which casts the weights to bf16 for the forward and backward and keeps fp32 master
weights in the optimizer (every ZeRO stage; stages 1-3 also accumulate gradients in
fp32). The model is loaded in fp32: DeepSpeed casts only the parameters, so buffers
(rotary frequencies, the audio encoder's sinusoids) stay fp32. DeepSpeed's CPU
accelerator supports bf16, so the same path runs (slowly) on CPU.

On CPU: backend gloo, `DS_ACCELERATOR=cpu`; the first init in a fresh machine
JIT-compiles DeepSpeed's `deepspeed_shm_comm` op (~30 s, cached under
~/.cache/torch_extensions).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

import torch

from asr_grpo.config.schema import LRScheduler
from asr_grpo.distributed.net import is_loopback, loopback_interface, tcp_store

SCHEDULERS = tuple(s.value for s in LRScheduler)
# DeepSpeed prints a line every `steps_per_print` steps; our own logger does that job.
_QUIET_STEPS = 10**9


def weights_only_globals() -> list:
    """The DeepSpeed classes its own checkpoints pickle besides tensors and containers
    (loss scaler, ZeRO stage enum, optimizer fragment addresses): the only globals a
    checkpoint may name when it is loaded."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path: str, map_location=None):
    """torch.load with weights_only=True and only `weights_only_globals()` allowed: a
    checkpoint naming any other global (code to run) fails to load instead of running it."""
    with torch.serialization.safe_globals(weights_only_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


def use_weights_only_loading(engine) -> None:
    """Make a DeepSpeed engine read its checkpoints with `load_weights_only` (its own
    engine calls torch.load(weights_only=False), which unpickles arbitrary code)."""
    from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

    ckpt_engine = engine.checkpoint_engine
    if type(ckpt_engine) is not TorchCheckpointEngine:
        raise TypeError(f"unexpected DeepSpeed checkpoint engine {type(ckpt_engine).__name__}: "
                        "only the torch one is known to load weights-only here")
    ckpt_engine.load = lambda path, map_location=None: load_weights_only(path, map_location)


def backend_for_device() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"



def init_distributed(rank: int, world_size: int, master_addr: str = "127.0.0.1",
                     master_port: int = 29500, backend: Optional[str] = None,
                     local_rank: Optional[int] = None) -> str:
    """Join the default process group (idempotent); returns the backend in use.

    DeepSpeed reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from the environment, so they
    are set here rather than passed, exactly as a launcher would. `local_rank` is the
    device index among this process's visible devices (defaults to `rank`, right for
    one host; pass 0 in a Ray actor that sees only its own GPU).
    """
    if not torch.cuda.is_available():
        # Must precede the first `import deepspeed`, which picks the accelerator once.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if torch.distributed.is_initialized():
        return torch.distributed.get_backend()
    backend = backend or backend_for_device()
    local_rank = rank if local_rank is None else local_rank
    os.environ.update({
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
    })
    if is_loopback(master_addr):   # a local run: the gloo / NCCL meshes stay on the loopback too
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, loopback_interface())
    # Our own rendezvous store, listening on master_addr only (torch's env:// one listens
    # on every interface); DeepSpeed then adopts the initialized default group.
    from torch.distributed.constants import default_pg_timeout

    extra = {}
    if backend == "nccl" and world_size > 1:
        extra["device_id"] = torch.device("cuda", local_rank)
    store = tcp_store(master_addr, master_port, world_size, rank == 0, default_pg_timeout)
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                         timeout=default_pg_timeout, **extra)
    deepspeed.init_distributed(dist_backend=backend)
    return backend


def shutdown_distributed() -> None:
    """Leave the default process group in step with the other ranks.

    A rank that exits with the group still up leaves gloo's and DeepSpeed's comm threads to
    static destructors, which can abort the process ("terminate called without an active
    exception") after all its work is done; so every rank waits for the others, then tears
    the group down itself.
    """
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def trained_precision(model_dtype: str) -> tuple[str, bool]:
    """(dtype to load a trained model in, whether DeepSpeed's bf16 mode is on) for
    `model.dtype`: bfloat16 -> fp32 weights handed to DeepSpeed's bf16 mode (bf16 compute,
    fp32 master weights); any other dtype trains as loaded."""
    return ("float32", True) if model_dtype == "bfloat16" else (model_dtype, False)


def _check(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"trainer.{key} must be {rule}, got {value!r}")


def deepspeed_config(trainer_cfg, world_size: int, *, lr: Optional[float] = None,
                     bf16: bool = False) -> dict:
    """A DeepSpeed config dict for `trainer_cfg` (a `TrainerConfig`) on `world_size` ranks.

    The optimizer and scheduler are built by `TrainingEngine` and passed as objects, so
    they are absent here; `lr` (e.g. `critic_lr`) is only validated. `bf16`: DeepSpeed's
    bf16 mode (bf16 weights, fp32 master weights), with fp32 gradient accumulation where
    DeepSpeed supports it (ZeRO 1-3; stage 0 accumulates in bf16).
    """
    c = trainer_cfg
    _check(c.zero_stage in (0, 1, 2, 3), "zero_stage", "one of 0, 1, 2, 3", c.zero_stage)
    _check(c.micro_batch_size >= 1, "micro_batch_size", ">= 1", c.micro_batch_size)
    _check(c.grad_accum_steps >= 1, "grad_accum_steps", ">= 1", c.grad_accum_steps)
    _check(c.grad_clip >= 0, "grad_clip", ">= 0 (0 disables clipping)", c.grad_clip)
    _check(c.weight_decay >= 0, "weight_decay", ">= 0", c.weight_decay)
    _check(c.lr_warmup_steps >= 0, "lr_warmup_steps", ">= 0", c.lr_warmup_steps)
    _check(c.lr_scheduler in SCHEDULERS, "lr_scheduler", f"one of {SCHEDULERS}", c.lr_scheduler)
    _check(c.num_threads == "auto" or (isinstance(c.num_threads, int) and c.num_threads >= 1),
           "num_threads", "'auto' or an integer >= 1", c.num_threads)
    lr = c.lr if lr is None else lr
    _check(lr > 0, "lr", "> 0", lr)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    extra = {"data_types": {"grad_accum_dtype": "fp32"}} if bf16 and c.zero_stage >= 1 else {}
    return {
        # DeepSpeed checks train_batch = micro * accumulation * world itself.
        "train_micro_batch_size_per_gpu": c.micro_batch_size,
        "gradient_accumulation_steps": c.grad_accum_steps,
        "train_batch_size": c.micro_batch_size * c.grad_accum_steps * world_size,
        "gradient_clipping": float(c.grad_clip),
        "zero_optimization": {"stage": c.zero_stage},
        "bf16": {"enabled": bool(bf16)},
        "fp16": {"enabled": False},
        # Our AdamW is a plain torch optimizer, which ZeRO otherwise refuses.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": _QUIET_STEPS,
        "wall_clock_breakdown": False,
        **extra,
    }


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters only (the frozen audio encoder never reaches the optimizer),
    with no decay on biases and norm weights (1-D tensors), as is customary for AdamW."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]  # ZeRO chokes on empty groups


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass instead of keeping them (HF gradient
    checkpointing, non-reentrant: it works with the frozen audio encoder, whose inputs
    need no grad). Only in training mode with grad on: a no-grad forward (rollout,
    scoring) still runs with its KV cache."""
    from asr_grpo.models.hf_compat import enable_checkpointing

    enable_checkpointing(model, use_reentrant=False)


class TrainingEngine:
    """A DeepSpeed engine plus the optimizer/scheduler built from a `TrainerConfig`.

    Call `backward(loss)` then `step()` for every micro-batch: DeepSpeed scales the loss
    by 1/grad_accum_steps, reduces gradients across ranks, and only steps the optimizer
    (with clipping) and the scheduler at accumulation boundaries. Requires
    `init_distributed` first. `bf16`: see `trained_precision`; `trainer_cfg.
    gradient_checkpointing` turns on the model's (HF) gradient checkpointing.
    """

    def __init__(self, model: torch.nn.Module, trainer_cfg, *, lr: Optional[float] = None,
                 num_training_steps: Optional[int] = None, bf16: bool = False):
        import deepspeed
        from transformers import get_scheduler

        world_size = torch.distributed.get_world_size()
        config = deepspeed_config(trainer_cfg, world_size, lr=lr, bf16=bf16)
        if trainer_cfg.num_threads != "auto":   # auto: the roles set threads per phase (roles/base.py)
            torch.set_num_threads(trainer_cfg.num_threads)
        self.zero_stage = trainer_cfg.zero_stage
        if getattr(trainer_cfg, "gradient_checkpointing", False):
            enable_gradient_checkpointing(model)
        optimizer = torch.optim.AdamW(_param_groups(model, trainer_cfg.weight_decay),
                                      lr=trainer_cfg.lr if lr is None else lr)
        # Scheduler steps are optimizer steps; the caller knows how many an RL step makes.
        scheduler = get_scheduler(trainer_cfg.lr_scheduler, optimizer,
                                  num_warmup_steps=trainer_cfg.lr_warmup_steps,
                                  num_training_steps=num_training_steps or trainer_cfg.steps)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
        use_weights_only_loading(self.engine)

    # -- training ------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped model (parameters are shards under ZeRO-3: see `gathered`)."""
        return self.engine.module

    @property
    def rank(self) -> int:
        return self.engine.global_rank

    def forward(self, *args, **kwargs):
        return self.engine(*args, **kwargs)

    __call__ = forward

    def parameters(self, recurse: bool = True):
        """The module's parameters (so model-generic helpers find its device and dtype)."""
        return self.module.parameters(recurse)

    def train(self, mode: bool = True) -> "TrainingEngine":
        self.engine.train(mode)
        return self

    def eval(self) -> "TrainingEngine":
        return self.train(False)

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        # Losses are computed on the model's device already; a loss from elsewhere is
        # handed to DeepSpeed on the engine's device, as its bookkeeping expects.
        return self.engine.backward(loss.to(self.engine.device))

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next `step()` updates the weights."""
        return self.engine.is_gradient_accumulation_boundary()

    def step(self) -> bool:
        """Advance one micro-batch; returns True when the optimizer stepped."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.step()
        return boundary

    @property
    def global_grad_norm(self) -> Optional[float]:
        """Pre-clipping grad norm of the last optimizer step (ZeRO 1-3; None for stage 0,
        where DeepSpeed clips without recording the norm)."""
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else float(norm)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    @property
    def global_steps(self) -> int:
        """Optimizer steps taken (restored by `load_checkpoint`)."""
        return self.engine.global_steps

    # -- checkpoints ---------------------------------------------------------------
    def save_checkpoint(self, directory: str, tag: str,
                        client_state: Optional[dict] = None, frozen: bool = True) -> None:
        """Collective: every rank writes its part under `directory/tag`.

        Covers model weights (frozen ones too, unless `frozen` is False: LoRA's base,
        which the model is built from again), the optimizer state (ZeRO partitions per
        rank), the LR scheduler, DeepSpeed's step counters, and `client_state` (e.g. the
        RL step and data position). Not covered: RNG states and data-loader order, which
        the caller restores via `client_state` if it needs them.
        """
        with contextlib.nullcontext() if frozen else self._trainable_module_state():
            self.engine.save_checkpoint(directory, tag=tag, client_state=client_state or {},
                                        exclude_frozen_parameters=not frozen)

    @contextlib.contextmanager
    def _trainable_module_state(self) -> Iterator[None]:
        """DeepSpeed's exclude_frozen_parameters drops frozen parameters by their name, so
        a tied alias of one (lm_head = embed_tokens: a second name in the state dict) is
        written anyway, the whole vocabulary matrix; keep the trainable tensors only."""
        keep = {name for name, p in self.module.named_parameters() if p.requires_grad}
        full = self.engine.module_state_dict
        self.engine.module_state_dict = lambda *a, **kw: {k: v for k, v in full(*a, **kw).items() if k in keep}
        try:
            yield
        finally:
            del self.engine.module_state_dict   # the class's method again

    def load_checkpoint(self, directory: str, tag: Optional[str] = None, frozen: bool = True) -> dict:
        """Collective; restores everything `save_checkpoint` wrote and returns client_state
        (`frozen`: as it was saved; False keeps the frozen weights the model holds).
        Files are read weights-only (`load_weights_only`): never unpickling code.

        Under ZeRO-3 load into a freshly built engine, not one that already trained.
        """
        path, client_state = self.engine.load_checkpoint(directory, tag=tag, load_module_strict=frozen)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {directory} (tag={tag})")
        return client_state

    # -- full weights --------------------------------------------------------------
    @contextlib.contextmanager
    def gathered(self) -> Iterator[torch.nn.Module]:
        """Collective: inside, `module` holds full parameters on every rank (a no-op below
        ZeRO-3), so e.g. rank 0 can `save_pretrained` it. Memory: the whole model."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()),
                                               enabled=self.zero_stage == 3):
            yield self.module

    def full_state_dict(self, rank0_only: bool = True) -> Optional[dict[str, torch.Tensor]]:
        """Collective: CPU copies of the full state dict (rank 0 only unless told), for
        `save_pretrained(state_dict=...)` or comparisons."""
        with self.gathered() as module:
            if rank0_only and self.rank != 0:
                return None
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
