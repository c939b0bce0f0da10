"""What the simulated machines cost: a `SimProfile`, plain numbers, from any of the three
sources (roofline, a fitted run, a measured table) and saved with the forecast.

Costs are seconds on the device group a role is placed on, so data parallelism over
that group's GPUs is already divided in. One forward over `tokens` tokens costs
`call_s + max(mem_s, per_token_s * tokens)`: reading the weights once (memory-bound for
a few tokens) or the FLOPs (compute-bound for many). A decode round of one engine costs
`overhead_s + max(mem_s + kv_s * context, flop_s * rows) + row_s * rows`, or, from a
measured table, the table at `rows` (+ `kv_s * context`)."""
from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field


@dataclass
class Forward:
    call_s: float = 0.0
    mem_s: float = 0.0
    per_token_s: float = 0.0

    def __call__(self, tokens: float) -> float:
        return self.call_s + max(self.mem_s, self.per_token_s * tokens) if tokens > 0 else 0.0


@dataclass
class DecodeCost:
    overhead_s: float = 0.0
    mem_s: float = 0.0
    kv_s: float = 0.0          # per context token (prompt + response so far) of every live row
    flop_s: float = 0.0        # per row, compute-bound
    row_s: float = 0.0         # per row, always (sampling and host work)
    table_rows: list[float] = field(default_factory=list)   # measured: seconds per round at these rows
    table_s: list[float] = field(default_factory=list)

    def base_s(self, rows: int) -> float:
        """A round at `rows` rows, without the context term."""
        if self.table_rows:
            return interpolate(self.table_rows, self.table_s, rows) + self.row_s * rows
        return self.overhead_s + self.row_s * rows

    def round_s(self, rows: int, context: float) -> float:
        if rows <= 0:
            return 0.0
        if self.table_rows:
            return self.base_s(rows) + self.kv_s * context
        return self.base_s(rows) + max(self.mem_s + self.kv_s * context, self.flop_s * rows)

    def rounds_s(self, k: int, rows: int, context: float) -> float:
        """k rounds at `rows` rows, the context growing by `rows` tokens a round (closed form)."""
        if k <= 0 or rows <= 0:
            return 0.0
        tri = k * (k - 1) / 2   # Σ j for j < k
        if self.table_rows:
            return k * self.base_s(rows) + self.kv_s * (k * context + rows * tri)
        # max(A + B j, C) over j < k: C until A + B j reaches C, then the line.
        a, b, c = self.mem_s + self.kv_s * context, self.kv_s * rows, self.flop_s * rows
        if b <= 0:
            flat = k * max(a, c)
        else:
            j0 = min(k, max(0, -int(-(c - a) // b)))   # first j with a + b j >= c
            flat = c * j0 + (k - j0) * a + b * (tri - j0 * (j0 - 1) / 2)
        return k * self.base_s(rows) + flat


def interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through the points; the end segments extend linearly (never below 0)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class RoleCost:
    device: str
    forward: Forward = field(default_factory=Forward)   # scoring / log-probs over prompt + response tokens
    train_per_token_s: float = 0.0                      # per token per epoch
    train_fixed_s: float = 0.0                          # per step: optimizer step, gradient all-reduce


@dataclass
class SimProfile:
    source: str
    hosts: int                      # rollout engines
    rollout_device: str
    decode: DecodeCost
    prefill: Forward                # an engine's rebuild: prompts + carried tokens, once per step
    roles: dict[str, RoleCost]      # actor (old log-probs, training), ref, critic, reward_model
    streaming: list[str]            # scoring roles that take streamed chunks in intra/oppo
    stream_hidden: float = 0.5      # share of a colocated scorer's streamed work the decode hides
    decode_call_s: float = 0.0      # per decode call per engine (driver round trip)
    stream_call_s: float = 0.0      # per streamed call, on top of its forward
    reward_per_sample_s: float = 0.0
    sync_s: float = 0.0
    step_fixed_s: float = 0.0
    train_epochs: int = 1
    recompute_old_logprobs: bool = True
    notes: list[str] = field(default_factory=list)   # how it was built
    # A reward service on another machine: seconds per sequence at its throughput, one
    # slot (`cost_model.CostProfile.remote_per_seq_s`); 0: the rewards are local.
    remote_per_seq_s: float = 0.0
    # Whether the service is fed each sequence as it finishes under intra/oppo
    # (`reward.remote.feed`); False: the whole batch after the rollout, in every mode.
    remote_fed: bool = False

    def scorers(self) -> list[str]:
        return [r for r in ("ref", "critic", "reward_model") if r in self.roles]

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SimProfile":
        d = dict(d)
        d["decode"] = DecodeCost(**d["decode"])
        d["prefill"] = Forward(**d["prefill"])
        d["roles"] = {k: RoleCost(v["device"], Forward(**v["forward"]), v.get("train_per_token_s", 0.0),
                                  v.get("train_fixed_s", 0.0)) for k, v in d["roles"].items()}
        return cls(**d)
