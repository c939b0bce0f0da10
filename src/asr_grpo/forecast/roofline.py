"""Costs from a GPU's datasheet and a model's shape (profile=roofline).

A decode round of one engine reads every weight once and each live row's KV cache, and
does 2 FLOPs per parameter per row: its time is the larger of the memory time and the
compute time (so whether a round is memory- or compute-bound is what the numbers say),
plus a fixed per-round overhead. A forward over T tokens (prefill, scoring, old
log-probs) is the same with T in place of the rows; training costs 3 forwards (forward
+ backward) per token, plus the optimizer's memory traffic and the gradient all-reduce
once per epoch. Attention FLOPs are left out (under ~10% below 4k tokens of context).
"""
from __future__ import annotations

from dataclasses import dataclass

from asr_grpo.forecast.costs import DecodeCost, Forward, RoleCost

ADAM_BYTES_PER_PARAM = 28   # fp32 master, m, v read and written, bf16 weight and gradient


@dataclass(frozen=True)
class Shape:
    """Parameter counts of a decoder (and its frozen audio encoder)."""
    body: float            # transformer layers
    vocab_matrix: float    # the output projection (shared with the embedding when tied)
    total: float
    encoder: float
    kv_bytes_per_token: float
    dtype_bytes: int

    @property
    def weight_bytes(self) -> float:
        """Read per forward: the layers and the output projection (an embedding lookup
        reads only its rows; a tied embedding is the same matrix)."""
        return self.dtype_bytes * (self.body + self.vocab_matrix)


def shape_of(m) -> Shape:
    attn = m.hidden * m.heads * m.head_dim * 2 + m.hidden * m.kv_heads * m.head_dim * 2
    mlp = 3 * m.hidden * m.intermediate
    body = m.layers * (attn + mlp + 2 * m.hidden)
    vocab = m.vocab * m.hidden
    total = body + vocab * (1 if m.tie_embeddings else 2) + m.audio_encoder_params
    kv = m.layers * 2 * m.kv_heads * m.head_dim * m.dtype_bytes
    return Shape(body, vocab, total, m.audio_encoder_params, kv, m.dtype_bytes)


@dataclass(frozen=True)
class Mix:
    """What the scored tokens are made of: the share that are response tokens (they need
    the output projection) and that are audio tokens (they ran the audio encoder)."""
    response_share: float
    audio_share: float


def forward_flops_per_token(s: Shape, mix: Mix, head: bool = True) -> float:
    """2 FLOPs per parameter per token; the output projection only where a response token
    is scored (`head`), the audio encoder once per audio token."""
    return 2 * s.body + (2 * s.vocab_matrix * mix.response_share if head else 0.0) + 2 * s.encoder * mix.audio_share


def decode_cost(s: Shape, gpu, tp: int) -> DecodeCost:
    bw = gpu.hbm_bandwidth_GBps * 1e9 * gpu.mem_efficiency * tp
    flops = gpu.bf16_dense_tflops * 1e12 * gpu.flop_efficiency * tp
    return DecodeCost(overhead_s=gpu.round_overhead_s, mem_s=s.weight_bytes / bw, kv_s=s.kv_bytes_per_token / bw,
                      flop_s=2 * (s.body + s.vocab_matrix) / flops)


def forward_cost(s: Shape, gpu, gpus: int, flops_per_token: float) -> Forward:
    """A data-parallel forward over a device group: each GPU reads its copy of the
    weights once per call, the tokens split over the GPUs."""
    bw = gpu.hbm_bandwidth_GBps * 1e9 * gpu.mem_efficiency
    return Forward(call_s=gpu.call_overhead_s, mem_s=s.weight_bytes / bw,
                   per_token_s=flops_per_token / (gpus * gpu.bf16_dense_tflops * 1e12 * gpu.flop_efficiency))


def train_cost(s: Shape, gpu, gpus: int, flops_per_token: float, frozen_flops_per_token: float,
               epochs: int) -> tuple[float, float]:
    """(seconds per token per epoch, fixed seconds per step): forward + backward of the
    trained weights (3x their forward), the frozen encoder's forward once; per epoch one
    optimizer step (ZeRO-sharded Adam traffic) and one gradient reduce over NVLink."""
    per_token = (3 * flops_per_token + frozen_flops_per_token) / (
        gpus * gpu.bf16_dense_tflops * 1e12 * gpu.train_efficiency)
    trained = s.body + s.vocab_matrix
    adam = ADAM_BYTES_PER_PARAM * trained / (gpus * gpu.hbm_bandwidth_GBps * 1e9 * gpu.mem_efficiency)
    reduce = 2 * (gpus - 1) / gpus * s.dtype_bytes * trained / (gpu.interconnect_GBps * 1e9) if gpus > 1 else 0.0
    return per_token, epochs * (adam + reduce)


def role_costs(role: str, device: str, gpus: int, shape: Shape, gpu, score_mix: Mix, train_mix: Mix, epochs: int,
               trains: bool) -> RoleCost:
    """A role's forward (and training) on its device group. The critic's value head
    replaces the output projection; the reward model scores with its own head only.
    Scoring forwards each prompt once for its samples (`score_mix`); training runs every
    sequence whole (`train_mix`)."""
    head = role in ("actor", "ref")
    cost = RoleCost(device, forward_cost(shape, gpu, gpus, forward_flops_per_token(shape, score_mix, head=head)))
    if trains:
        flops = forward_flops_per_token(shape, train_mix, head=head)
        encoder = 2 * shape.encoder * train_mix.audio_share
        # per token per epoch (the simulator multiplies by the epochs); fixed: all epochs' optimizer steps
        cost.train_per_token_s, cost.train_fixed_s = train_cost(shape, gpu, gpus, flops - encoder, encoder, epochs)
    return cost
