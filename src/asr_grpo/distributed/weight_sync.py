"""Trainer rank 0 -> rollout engines: broadcast fresh policy weights.

The sync group is [trainer rank 0, rollout rank 1, ..., rollout rank N]. It is built as a
standalone backend object (`ProcessGroupGloo` / `ProcessGroupNCCL` over its own
`TCPStore`) rather than through `torch.distributed.init_process_group`/`new_group`:
those would need every member in the default group, which belongs to DeepSpeed on the
trainer side and may not exist at all on the rollout side. The backend's own
`broadcast(tensor, root)` is called directly, so c10d's group registry is never touched
and no private torch helper is needed.

Protocol: both sides hold the same architecture (the rollout model is built from the
same config/checkpoint) and walk `model.named_parameters()` then `named_buffers()`,
which yield each tensor once, so tied weights (lm_head = embed_tokens) are sent once.
Everything is sent, frozen encoder included: simplest and always correct, and the
frozen part is small next to an LM. A header of (numel, dtype) per tensor goes first,
so a mismatched architecture fails with a clear error instead of hanging or
scrambling weights, and a receiver in another dtype (e.g. bf16 rollout) gets a cast.
A receiver that holds no copy of the module (a vLLM worker, whose weights are laid out
differently) takes the tensors one by one with `receive_tensors`, given the sender's
`tensor_specs` (names and shapes), and loads them its own way.

With LoRA (`model.lora`) the sender chooses the list (`broadcast_tensors`): only the
adapters' tensors to a receiver wrapped the same way (`receive_into`), or the plain
model's tensors with the adapters merged in as they are read, which any receiver of the
plain layout takes unchanged.
"""
from __future__ import annotations

import contextlib
import datetime
import math
from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist

from asr_grpo.distributed.net import tcp_store

# dtype <-> int for the header (only dtypes a model would hold).
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32, torch.bool, torch.uint8, torch.int8]


def model_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Unique parameters then buffers, in a deterministic order on both sides."""
    return list(model.named_parameters()) + list(model.named_buffers())


def _specs(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(getattr(t, "ds_shape", t.shape))) for name, t in tensors]


def _full_numel(t: torch.Tensor) -> int:
    # A ZeRO-3 partitioned parameter is an empty placeholder; ds_numel is its real size.
    return getattr(t, "ds_numel", t.numel())


class WeightSyncGroup:
    """One member of the trainer-rank-0 + rollout-ranks broadcast group (rank 0 sends)."""

    def __init__(self, backend_pg, store, rank: int, world_size: int, device: torch.device):
        self._pg, self._store = backend_pg, store  # the store must outlive the group
        self.rank, self.world_size, self.device = rank, world_size, device

    @classmethod
    def create(cls, master_addr: str, master_port: int, rank: int, world_size: int,
               backend: str = "gloo", timeout_s: float = 600.0) -> "WeightSyncGroup":
        """Collective over the sync group: blocks until all `world_size` members called it,
        so start the remote members (e.g. Ray calls) before the local one. Rank 0 hosts
        the store on `master_addr:master_port`, a port distinct from MASTER_PORT."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = tcp_store(master_addr, master_port, world_size, rank == 0, timeout)   # binds master_addr only
        if backend == "gloo":
            pg, device = dist.ProcessGroupGloo(store, rank, world_size, timeout), torch.device("cpu")
        elif backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"weight sync backend must be 'gloo' or 'nccl', got {backend!r}")
        return cls(pg, store, rank, world_size, device)

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._pg.broadcast(tensor, 0).wait()

    def _in_place_ok(self, tensor: torch.Tensor) -> bool:
        return tensor.device == self.device and tensor.is_contiguous()

    def _exchange_header(self, header: torch.Tensor) -> torch.Tensor:
        count = torch.tensor([len(header)], dtype=torch.int64, device=self.device)
        self._broadcast(count)
        if self.rank != 0:
            header = torch.empty(int(count), 2, dtype=torch.int64, device=self.device)
        header = header.to(self.device)
        self._broadcast(header)
        return header.cpu()

    # -- sender -------------------------------------------------------------------
    def broadcast_model(self, model: torch.nn.Module, zero_stage: int = 0) -> None:
        """Trainer rank 0: send every tensor of `model` (the unwrapped module)."""
        broadcast_model(model, zero_stage, self)

    # -- receiver -----------------------------------------------------------------
    def _header_for(self, specs: list[tuple[str, tuple[int, ...]]]) -> list[tuple[int, int]]:
        """Receive the sender's header and check it against this side's (name, shape)s."""
        header = self._exchange_header(torch.empty(0, 2, dtype=torch.int64)).tolist()
        if len(header) != len(specs):
            raise ValueError(f"weight sync: sender has {len(header)} tensors, this model "
                             f"{len(specs)}: not the same architecture")
        for (name, shape), (numel, _) in zip(specs, header):
            if numel != math.prod(shape):
                raise ValueError(f"weight sync: {name} has {math.prod(shape)} elements here, "
                                 f"{numel} on the sender")
        return header

    def receive_model(self, model: torch.nn.Module) -> None:
        """Rollout ranks: overwrite `model`'s tensors in place with rank 0's."""
        self.receive_into(model_tensors(model))

    @torch.no_grad()
    def receive_into(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Overwrite `tensors` (name, tensor) in place with what rank 0 sends, in this
        order: the sender's list must match (e.g. both sides' LoRA `adapter_tensors`)."""
        header = self._header_for(_specs(tensors))
        for (_, t), (_, code) in zip(tensors, header):
            dtype = _DTYPES[code]
            if dtype == t.dtype and self._in_place_ok(t):
                self._broadcast(t.data)  # straight into the parameter
            else:  # receive as sent, then cast/move
                buf = torch.empty(t.shape, dtype=dtype, device=self.device)
                self._broadcast(buf)
                t.data.copy_(buf)

    def receive_tensors(self, specs: list[tuple[str, tuple[int, ...]]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Receivers without the sender's module (a vLLM worker): yield (name, tensor)
        one at a time, in the sender's order, as sent (dtype included). `specs` is
        `tensor_specs` of the sender's architecture; consume every item."""
        for (name, shape), (_, code) in zip(specs, self._header_for(specs)):
            buf = torch.empty(shape, dtype=_DTYPES[code], device=self.device)
            self._broadcast(buf)
            yield name, buf


def tensor_specs(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, full shape) of every tensor the sender walks, in its order; a model built
    on the meta device gives the same list without allocating its weights."""
    return _specs(model_tensors(model))


def broadcast_model(model: torch.nn.Module, zero_stage: int,
                    group: Optional[WeightSyncGroup]) -> None:
    """Call on EVERY trainer rank under ZeRO-3 (gathering a shard is a collective of the
    DeepSpeed group), with `group` None except on trainer rank 0; below ZeRO-3 only
    rank 0 needs to call. Gathers one parameter at a time, so peak extra memory is the
    largest tensor, not the model."""
    broadcast_tensors(model_tensors(model), zero_stage, group)


@torch.no_grad()
def broadcast_tensors(tensors: list[tuple[str, torch.Tensor]], zero_stage: int,
                      group: Optional[WeightSyncGroup],
                      read: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None) -> None:
    """`broadcast_model` for a chosen list of (name, tensor). `read(name, tensor)` gives
    the values to send in each tensor's place, of its shape and dtype (a LoRA layer's
    weight with its delta merged in: `models.lora.merged_tensors`); by default the tensor."""
    if group is not None:
        header = torch.tensor([[_full_numel(t), _DTYPES.index(t.dtype)] for _, t in tensors],
                              dtype=torch.int64).reshape(-1, 2)
        group._exchange_header(header)
    for name, t in tensors:
        with _gathered(t, zero_stage):
            if group is not None:
                value = t.data if read is None else read(name, t.data)
                data = value if group._in_place_ok(value) else value.to(group.device).contiguous()
                group._broadcast(data)


def _gathered(t: torch.Tensor, zero_stage: int):
    """Full `t` inside the context under ZeRO-3 (buffers, never partitioned, pass through)."""
    if zero_stage != 3:
        return contextlib.nullcontext()  # no deepspeed import for plain senders
    import deepspeed

    return deepspeed.zero.GatheredParameters([t])
