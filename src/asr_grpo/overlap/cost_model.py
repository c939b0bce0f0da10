"""A cost model of one RL step under overlap: what a decode round, a scorer token, a
trained sample cost, and how long responses are; from it, the predicted step time for
any chunk size and overcommit degree Δ.

The same module serves the `cost_model` overlap controller (fitted online from the
run's own timings) and the forecast (fitted from a finished run, a roofline, or a
measured table). Everything here is plain Python on numbers: no Ray, no torch.

The step, as the model sees it:

    step = decode + exposed scoring + training + fixed
    decode  = Σ_rounds (a + b · live rows) + p · carried tokens re-prefilled
              (a carried group's whole prompt, its audio included, and its partial
              responses: the weights changed, so its cache is rebuilt every step it waits)
    scoring = s0 + s · tokens of the trained sequences; streaming (chunk c) moves all
              but the last chunk of it into the decode, where a share `hidden` of it
              is hidden (0 where scorers and actor share the same cores), and adds
              `call` seconds per streaming call
    training = t · trained samples;  fixed = sync and everything else
    remote  = the wait on a reward service (another machine): r seconds per sequence at
              its throughput. Serially every sequence is sent after the decode (N · r);
              streaming sends each at the end of the chunk it finished in, so the wait
              left after the decode is what the service has not drained by then
              (`service_drain`, over the simulated steps' finish rounds). Under a feed
              (the driver takes finished sequences from the running decode, whatever
              the chunk) the wait is the same for every plan: the measured one.

Decode rounds and rows come from simulating the overcommit buffer with response lengths
(and prompt sizes) drawn from the observed groups: with B + Δ groups in flight the step
ends when B are done, and the others carry their tokens into the next step. In ASR the
groups that get carried are the long ones, whose prompts (long audio) are long too.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

HIDDEN_RATE = 1 / 3   # how far one streaming step moves the estimate of the hidden share


@dataclass
class CostProfile:
    round_fixed_s: float = 0.0         # a: a decode round's cost whatever the rows
    round_per_row_s: float = 0.0       # b: each live row's share of a round
    prefill_per_token_s: float = 0.0   # p: re-prefilling a carried token when the step starts
    score_fixed_s: float = 0.0         # s0: scoring per step that no overlap hides (rewards, old log-probs)
    score_per_token_s: float = 0.0     # s: scorer work per response token of a trained sequence
    stream_hidden: float = 0.0         # share of streamed scorer work that decode hides (0..1)
    stream_call_s: float = 0.0         # overhead of one streaming call (per decode call)
    train_per_sample_s: float = 0.0    # t: old log-probs' remainder, update, per trained sample
    step_fixed_s: float = 0.0          # weight sync and everything else per step
    remote_per_seq_s: float = 0.0      # r: a reward service's seconds per sequence (0: no service)
    remote_fed_wait_s: float = 0.0     # the service's wait left after a fed decode (measured)

    def round_s(self, rows: int) -> float:
        return self.round_fixed_s + self.round_per_row_s * rows if rows else 0.0


@dataclass
class StepShape:
    """What a step does, averaged over simulated steps: the inputs to `predict`."""
    rounds: float          # decode rounds (forward passes of the actor)
    row_rounds: float      # Σ live rows over those rounds (tokens decoded)
    carried_tokens: float  # tokens re-prefilled at the step's start (carried prompts + partial responses)
    trained_tokens: float  # response tokens of the trained sequences
    carried_groups: float  # groups carried with unfinished samples
    wasted_rows: float = 0.0   # rows decoded for nothing (always 0: carried work is kept)
    # Per simulated step: (live rows in each decode round, the round in which each
    # sequence that finished in the step ended): when a reward service gets each one.
    timelines: tuple = ()


def simulate_buffer(groups: Sequence[Sequence[int]], B: int, delta: int, steps: int = 24,
                    seed: int = 0, wait_all: bool = False, prompts: Sequence[int] | None = None) -> StepShape:
    """Steady-state shape of a step with B + Δ groups in flight, lengths drawn (seeded,
    so the same inputs give the same answer) from `groups` (each the response lengths
    of one group's samples; `prompts`: each one's prompt tokens). `wait_all`: the serial
    rule (decode every group to its end). The first third of the steps (the buffer
    filling) is not averaged."""
    if not groups:
        raise ValueError("simulate_buffer: no observed groups to draw lengths from")
    if prompts is not None and len(prompts) != len(groups):
        raise ValueError(f"simulate_buffer: {len(prompts)} prompt sizes for {len(groups)} groups")
    rng = random.Random(seed)
    buffer: list[list[int]] = []   # per group, the tokens each sample still has to decode
    done: list[list[int]] = []     # per group, the tokens each sample already holds
    prompt: list[int] = []         # per group, its prompt tokens
    burn = steps // 3
    total = StepShape(0, 0, 0, 0, 0)
    timelines = []
    for step in range(steps):
        while len(buffer) < B + delta:
            i = rng.randrange(len(groups))
            buffer.append(list(groups[i]))
            done.append([0] * len(groups[i]))
            prompt.append(prompts[i] if prompts is not None else 0)
        # Carried groups still decoding are rebuilt: their prompt once, their partial responses.
        carried = sum(p + sum(d) for d, g, p in zip(done, buffer, prompt) if max(g) > 0 and any(d))
        finish = [max(g) for g in buffer]
        k = len(buffer) if wait_all else min(B, len(buffer))
        order = sorted(range(len(buffer)), key=lambda i: (finish[i], i))
        horizon = finish[order[k - 1]]
        rows = sum(min(r, horizon) for g in buffer for r in g)
        remaining = [r for g in buffer for r in g if r > 0]
        chosen = set(order[:k])
        trained = sum(d + r for i in chosen for d, r in zip(done[i], buffer[i]))
        still = [i for i in range(len(buffer)) if i not in chosen]
        carried_groups = sum(1 for i in still if finish[i] > horizon)
        buffer, done, prompt = ([[max(0, r - horizon) for r in buffer[i]] for i in still],
                                [[d + min(r, horizon) for d, r in zip(done[i], buffer[i])] for i in still],
                                [prompt[i] for i in still])
        if step >= burn:
            live = [sum(r > k for r in remaining) for k in range(horizon)]
            timelines.append((tuple(live), tuple(sorted(r for r in remaining if r <= horizon))))
            for name, value in (("rounds", horizon), ("row_rounds", rows), ("carried_tokens", carried),
                                ("trained_tokens", trained), ("carried_groups", carried_groups)):
                setattr(total, name, getattr(total, name) + value)
    n = steps - burn
    return StepShape(*(getattr(total, f) / n for f in ("rounds", "row_rounds", "carried_tokens",
                                                       "trained_tokens", "carried_groups")),
                     timelines=tuple(timelines))


def service_drain(arrivals: Sequence[float], per_seq_s: float, slots: int = 1, latency_s: float = 0.0) -> float:
    """When a service with `slots` parallel slots, `per_seq_s` seconds a sequence each
    (first come, first served), has answered sequences that became ready at `arrivals`
    (seconds), with `latency_s` of network round trip on top. One slot at r = rate⁻¹ is
    the cost model's service; the measured slots and service time give the ideal of a
    benchmark."""
    free = [0.0] * max(1, slots)
    end = 0.0
    for a in sorted(arrivals):
        i = min(range(len(free)), key=free.__getitem__)
        free[i] = max(free[i], a + latency_s / 2) + per_seq_s
        end = max(end, free[i] + latency_s / 2)
    return end


def remote_wait(costs: CostProfile, shape: StepShape, chunk: int | None) -> float:
    """The reward service's wait left after the decode, averaged over the simulated
    steps: a sequence is sent at the end of the decode call it finished in (every
    `chunk` rounds; without streaming, when the decode ends)."""
    if costs.remote_per_seq_s <= 0 or not shape.timelines:
        return 0.0
    waits = []
    for live, finish_rounds in shape.timelines:
        ends, t = [], 0.0
        for rows in live:
            t += costs.round_s(rows)
            ends.append(t)
        decoded = ends[-1] if ends else 0.0
        sent = [ends[min(len(ends), chunk * math.ceil(f / chunk)) - 1] if chunk and ends else decoded
                for f in finish_rounds]
        waits.append(max(0.0, service_drain(sent, costs.remote_per_seq_s) - decoded))
    return sum(waits) / len(waits)


@dataclass
class Prediction:
    step_s: float
    decode_s: float
    scoring_s: float
    training_s: float
    fixed_s: float
    shape: StepShape

    def per_sample(self, samples: int) -> float:
        return self.step_s / max(1, samples)


def predict(costs: CostProfile, shape: StepShape, samples: int, chunk: int | None,
            mean_length: float, fed: bool = False) -> Prediction:
    """Step time for a step of `shape` training `samples` sequences, streaming every
    `chunk` tokens (None: no streaming); `fed`: a reward service gets each sequence as
    it finishes, whatever the chunk."""
    decode = (costs.round_fixed_s * shape.rounds + costs.round_per_row_s * shape.row_rounds
              + costs.prefill_per_token_s * shape.carried_tokens)
    work = costs.score_per_token_s * shape.trained_tokens
    scoring = costs.score_fixed_s + work
    if chunk:
        # After decode ends, the last chunk of every sequence is still to score: on
        # average half a chunk, never more than the sequence.
        tail = min(1.0, 0.5 * chunk / max(1.0, mean_length))
        streamed = work * (1.0 - tail)
        hidden = min(costs.stream_hidden * streamed, decode)
        calls = math.ceil(shape.rounds / chunk) if shape.rounds else 0
        scoring = costs.score_fixed_s + work - hidden + costs.stream_call_s * calls
    scoring += costs.remote_fed_wait_s if fed else remote_wait(costs, shape, chunk)
    training = costs.train_per_sample_s * samples
    return Prediction(decode + scoring + training + costs.step_fixed_s, decode, scoring, training,
                      costs.step_fixed_s, shape)


@dataclass
class Choice:
    chunk: int | None
    delta: int
    predicted: Prediction


def best_plan(costs: CostProfile, groups: Sequence[Sequence[int]], B: int, chunks: Iterable[int | None],
              deltas: Iterable[int], margin: float = 0.03, prompts: Sequence[int] | None = None,
              fed: bool = False) -> tuple[Choice, dict]:
    """The (chunk, Δ) with the least predicted time per trained sample. The serial plan
    (no streaming, Δ = 0) wins unless another beats it by more than `margin` (a share
    of the serial step): a prediction within the model's error is no reason to overlap.
    Returns the choice and every candidate's predicted step seconds."""
    n = max(1, round(sum(len(g) for g in groups) / len(groups)))
    samples = B * n
    mean_len = sum(sum(g) for g in groups) / max(1, sum(len(g) for g in groups))
    shapes = {d: simulate_buffer(groups, B, d, prompts=prompts) for d in sorted(set(deltas) | {0})}
    table = {}
    for d, shape in shapes.items():
        for c in [None, *(c for c in chunks if c)]:
            table[(c, d)] = predict(costs, shape, samples, c, mean_len, fed)
    serial = table[(None, 0)]
    best = min(table, key=lambda k: (table[k].step_s, k[1], k[0] or 0))
    if table[best].step_s > serial.step_s * (1.0 - margin):
        best = (None, 0)
    return Choice(best[0], best[1], table[best]), {f"{c or 0}/{d}": p.step_s for (c, d), p in table.items()}


@dataclass
class CostFitter:
    """Fits a `CostProfile` online from what each step measured. Older observations
    fade (`decay` per step) so the fit follows a run whose costs drift."""
    decay: float = 0.9
    stream_hidden_prior: float = 0.0
    max_groups: int = 256
    # weighted sums for round(rows) = a + b * rows: Σw, Σw·r, Σw·r², Σw·y, Σw·r·y
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)
    _prefill: list[float] = field(default_factory=lambda: [0.0, 0.0])   # tokens, seconds
    _serial: dict[str, float] = field(default_factory=dict)             # per-step averages of serial steps
    _hidden: float | None = None
    groups: deque = field(default_factory=deque)
    prompts: deque = field(default_factory=deque)   # each observed group's prompt tokens

    def observe_decode(self, stats: dict) -> None:
        """Decode-round and prefill costs from the rollout hosts (`take_decode_stats`)."""
        self._sums = [x * self.decay for x in self._sums]
        for rows, (count, secs) in stats.get("rounds", {}).items():
            r = float(rows)
            for i, v in enumerate((count, count * r, count * r * r, secs, secs * r)):
                self._sums[i] += v
        self._prefill = [self._prefill[0] * self.decay + stats.get("prefill_tokens", 0),
                         self._prefill[1] * self.decay + stats.get("prefill_seconds", 0.0)]

    def observe_lengths(self, groups: Iterable[Sequence[int]], prompts: Sequence[int] | None = None) -> None:
        """Response lengths (and prompt tokens) of the trained groups (every group is
        trained eventually, so over steps this is the unbiased distribution even under
        overcommit)."""
        groups = list(groups)
        for g, p in zip(groups, prompts if prompts is not None else [0] * len(groups)):
            self.groups.append(tuple(int(x) for x in g))
            self.prompts.append(int(p))
            while len(self.groups) > self.max_groups:
                self.groups.popleft()
                self.prompts.popleft()

    def observe_step(self, *, streamed: bool, decode_s: float, scoring_s: float, training_s: float,
                     fixed_s: float, samples: int, trained_tokens: int, predicted_decode_s: float | None = None,
                     streamed_work_s: float | None = None, remote_wait_s: float = 0.0,
                     remote_sequences: int = 0, fed: bool = False) -> None:
        """Phase times of a finished step. Serial steps fit scoring and training costs
        (and, with a reward service whose `remote_sequences` were sent after the decode,
        its seconds per sequence; `fed`: sent as they finished, the wait left); a
        streaming step measures how much of the streamed work decode really hid."""
        if remote_sequences:
            scoring_s = max(0.0, scoring_s - remote_wait_s)   # the service's wait is modelled on its own
            if fed:
                old = self._serial.get("remote_fed_wait")
                self._serial["remote_fed_wait"] = (remote_wait_s if old is None
                                                   else self.decay * old + (1 - self.decay) * remote_wait_s)
        if not streamed:
            obs = {"score_per_token": scoring_s / max(1, trained_tokens),
                   "train_per_sample": training_s / max(1, samples), "fixed": fixed_s}
            if remote_sequences and not fed:
                obs["remote_per_seq"] = remote_wait_s / remote_sequences
            for k, v in obs.items():
                old = self._serial.get(k)
                self._serial[k] = v if old is None else self.decay * old + (1 - self.decay) * v
            return
        if predicted_decode_s is None or not streamed_work_s:
            return
        serial_scoring = self._serial.get("score_per_token", 0.0) * trained_tokens
        # Saved scoring time, less what the decode slowed down by, over the work streamed.
        gain = (serial_scoring - scoring_s) - max(0.0, decode_s - predicted_decode_s)
        seen = min(1.0, max(0.0, gain / streamed_work_s))
        # Moves from the prior a third of the way per streaming step: one noisy step
        # must not end streaming for good (a planner that stops streaming stops measuring).
        before = self.stream_hidden_prior if self._hidden is None else self._hidden
        self._hidden = before + HIDDEN_RATE * (seen - before)

    @property
    def ready(self) -> bool:
        return self._sums[0] > 0 and bool(self._serial) and bool(self.groups)

    def profile(self) -> CostProfile:
        w, wr, wrr, wy, wry = self._sums
        var = w * wrr - wr * wr
        if w <= 0:
            a = b = 0.0
        elif var <= 1e-12 * max(1.0, w * wrr):   # one row count only: all of it per row
            a, b = 0.0, wy / wr if wr else 0.0
        else:
            b = (w * wry - wr * wy) / var
            a = (wy - b * wr) / w
            if a < 0:
                a, b = 0.0, wry / wrr
            elif b < 0:
                a, b = wy / w, 0.0
        tokens, secs = self._prefill
        return CostProfile(round_fixed_s=a, round_per_row_s=b,
                           prefill_per_token_s=secs / tokens if tokens else 0.0,
                           score_per_token_s=self._serial.get("score_per_token", 0.0),
                           stream_hidden=self.stream_hidden_prior if self._hidden is None else self._hidden,
                           train_per_sample_s=self._serial.get("train_per_sample", 0.0),
                           step_fixed_s=self._serial.get("fixed", 0.0),
                           remote_per_seq_s=self._serial.get("remote_per_seq", 0.0),
                           remote_fed_wait_s=self._serial.get("remote_fed_wait", 0.0))

    def state_dict(self) -> dict:
        return {"sums": list(self._sums), "prefill": list(self._prefill), "serial": dict(self._serial),
                "hidden": self._hidden, "groups": [list(g) for g in self.groups], "prompts": list(self.prompts)}

    def load_state_dict(self, state: dict) -> None:
        self._sums, self._prefill = list(state["sums"]), list(state["prefill"])
        self._serial, self._hidden = dict(state["serial"]), state["hidden"]
        self.groups = deque((tuple(g) for g in state["groups"]), maxlen=None)
        self.prompts = deque(state.get("prompts") or [0] * len(self.groups))


def profile_dict(costs: CostProfile) -> dict:
    return asdict(costs)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when (numerically) singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    scale = max((abs(x) for row in a for x in row), default=0.0) or 1.0
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) <= 1e-12 * scale:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def nonneg_least_squares(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """min |X c - y|² subject to c >= 0, for a few columns: the optimum is the plain least
    squares fit on some set of columns, so every set is tried and the best feasible kept."""
    if not rows:
        raise ValueError("nonneg_least_squares: no observations")
    k = len(rows[0])
    best, best_err = [0.0] * k, sum(v * v for v in y)
    for mask in range(1, 2 ** k):
        cols = [j for j in range(k) if mask >> j & 1]
        gram = [[sum(r[i] * r[j] for r in rows) for j in cols] for i in cols]
        sol = _solve(gram, [sum(r[i] * v for r, v in zip(rows, y)) for i in cols])
        if sol is None or min(sol) < 0:
            continue
        coef = [0.0] * k
        for j, c in zip(cols, sol):
            coef[j] = c
        err = sum((sum(r[j] * coef[j] for j in range(k)) - v) ** 2 for r, v in zip(rows, y))
        if err < best_err * (1 - 1e-9):
            best, best_err = coef, err
    return best


def fit_round_costs(decode_s: Sequence[float], rounds: Sequence[float], rows: Sequence[float],
                    calls: Sequence[float] | None = None) -> dict[str, float]:
    """Per-step decode time = a · rounds + b · rows decoded (+ c · decode calls, which
    carry the prefill and call overhead), by non-negative least squares: what a run that
    logs only per-step totals (`overlap/decode_rounds`, `overlap/rows_decoded`,
    `perf/time/rollout_decode`) says about a decode round's fixed and per-row cost.
    `spread` is the relative spread of rows per round over the steps: near 0 the steps
    cannot tell a from b apart (the fit then rests on whichever column fits first)."""
    n = len(decode_s)
    if n == 0 or len(rounds) != n or len(rows) != n:
        raise ValueError("fit_round_costs: need equal-length, non-empty per-step series")
    cols = [list(rounds), list(rows)] + ([list(calls)] if calls is not None else [])
    a, b, *rest = nonneg_least_squares([list(r) for r in zip(*cols)], list(decode_s))
    ratios = [w / r for w, r in zip(rows, rounds) if r > 0]
    mean = sum(ratios) / len(ratios) if ratios else 0.0
    spread = (max(ratios) - min(ratios)) / mean if mean > 0 else 0.0
    return {"round_fixed_s": a, "round_per_row_s": b, "per_call_s": rest[0] if rest else 0.0, "spread": spread}
