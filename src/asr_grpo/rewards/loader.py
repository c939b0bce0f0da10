"""Loading a reward file and calling it safely.

Any OpenRLHF reward file works as it is: `reward_func(queries, prompts, labels)` gets
only the keyword arguments its signature accepts (`accepted_kwargs`), and may return the
rewards alone (tensor, list of numbers, NumPy array) or the dict (`to_reward_result`).

A reward file is user code: everything that can go wrong with it (missing file,
import error, no `reward_func`, a signature the call cannot fit, an exception, a hang,
the wrong output) becomes a `RewardFunctionError` naming the file, the cause and the
samples, and non-finite rewards are either refused (naming component and samples) or
masked out; no NaN leaves here.

With on_bad="drop" a call that raises is retried one sample at a time, so only the
samples it fails on are dropped; a call that hangs drops its whole batch (which
sample hangs cannot be told without waiting out every one). A broken contract (wrong
signature, type or length) is a bug in the file, not in a sample: it raises under both
policies.
"""
from __future__ import annotations

import inspect
import logging
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

# Loading and the signature check live with the config, which validates a run's reward
# file before Ray starts; re-exported here, where callers of the reward file look.
from asr_grpo.config.reward_file import (  # noqa: F401 - re-exports
    BUILTIN_REWARD_FILE,
    TOOLKIT_KWARGS,
    RewardFunctionError,
    accepted_kwargs,
    check_signature,
    load_reward_function,
)
from asr_grpo.rewards.combine import RewardResult

log = logging.getLogger(__name__)

ON_BAD_POLICIES = ("error", "drop")
_THREAD_NAME = "reward_func"


class RewardCallFailed(RewardFunctionError):
    """`reward_func` raised (the cause is chained)."""


class RewardTimeout(RewardFunctionError):
    """`reward_func` did not return in time; its thread is still running."""


def hung_reward_calls() -> int:
    """Timed-out reward_func threads still running in this process (only a restart of
    the process reclaims them)."""
    return sum(t.name == _THREAD_NAME and t.is_alive() for t in threading.enumerate())


def describe_samples(sample_ids: Sequence | None, n: int, limit: int = 8) -> str:
    ids = list(sample_ids) if sample_ids is not None else list(range(n))
    shown = ", ".join(map(str, ids[:limit])) + (", ..." if len(ids) > limit else "")
    return f"{n} sample{'s' if n != 1 else ''}: [{shown}]"


def _source_of(fn: Callable) -> str:
    try:
        return inspect.getsourcefile(fn) or repr(fn)
    except TypeError:
        return repr(fn)


def _run_with_timeout(fn: Callable, timeout_s: float | None, source: str, samples: str, *args, **kwargs):
    """Run fn in a daemon thread and wait at most timeout_s.

    A Python thread cannot be killed: a timed-out call keeps running in the
    background (daemon, so it never blocks interpreter exit). In training the reward
    runs inside a Ray `RewardWorker`, which the caller can kill and restart to
    reclaim it; in-process callers only get the error.
    """
    box: dict[str, Any] = {}

    def target():
        try:
            box["out"] = fn(*args, **kwargs)
        except BaseException as exc:   # noqa: BLE001 - re-raised in the caller's thread
            box["exc"] = exc

    thread = threading.Thread(target=target, name=_THREAD_NAME, daemon=True)
    thread.start()
    thread.join(timeout_s if timeout_s and timeout_s > 0 else None)
    if thread.is_alive():
        raise RewardTimeout(
            f"reward file {source}: reward_func did not return within {timeout_s} s ({samples})")
    if "exc" in box:
        exc = box["exc"]
        raise RewardCallFailed(
            f"reward file {source}: reward_func raised {type(exc).__name__}: {exc} ({samples})") from exc
    return box["out"]


def _as_vector(value: Any, key: str, n: int, source: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu", torch.float32)
    elif isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float, np.integer, np.floating))
            or (isinstance(v, torch.Tensor) and v.numel() == 1)
            for v in value):
        t = torch.tensor([float(v) for v in value], dtype=torch.float32)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        t = torch.from_numpy(value.astype(np.float32))
    else:
        raise RewardFunctionError(
            f"reward file {source}: {key!r} must be a tensor or a list of numbers, "
            f"got {type(value).__name__}")
    if t.shape != (n,):
        raise RewardFunctionError(
            f"reward file {source}: {key!r} has shape {tuple(t.shape)}, expected ({n},) "
            "(one value per sample)")
    return t


def to_reward_result(out: Any, n: int, source: str) -> RewardResult:
    """reward_func's output for n samples as a `RewardResult`, after type and shape
    checks (finiteness is `sanitize`'s job): a dict {"rewards", "scores"?, "extra_logs"?}
    or, as many OpenRLHF files return, the rewards alone. `source` names the file in errors."""
    if isinstance(out, (torch.Tensor, list, tuple, np.ndarray)):
        out = {"rewards": out}
    if not isinstance(out, dict) or "rewards" not in out:
        got = type(out).__name__
        if isinstance(out, dict):
            got += f" with keys {sorted(map(str, out))}"
        raise RewardFunctionError(
            f"reward file {source}: reward_func must return a dict with 'rewards', got {got} "
            "(or the rewards alone: a tensor, a list of numbers or a NumPy array)")
    rewards = _as_vector(out["rewards"], "rewards", n, source)
    scores = out.get("scores")
    scores = rewards.clone() if scores is None else _as_vector(scores, "scores", n, source)
    extra = out.get("extra_logs") or {}
    if not isinstance(extra, dict):
        raise RewardFunctionError(
            f"reward file {source}: 'extra_logs' must be a dict, got {type(extra).__name__}")
    components = {str(k): _as_vector(v, f"extra_logs/{k}", n, source)
                  for k, v in extra.items()}
    return RewardResult(total=rewards, components=components, scores=scores)


def _check_on_bad(on_bad: str) -> None:
    if on_bad not in ON_BAD_POLICIES:
        raise ValueError(f"on_bad must be one of {ON_BAD_POLICIES}, got {on_bad!r}")


def sanitize(result: RewardResult, on_bad: str = "error", *,
             sample_ids: Sequence | None = None, source: str = "<reward>") -> RewardResult:
    """Handle non-finite values in rewards, scores and every component.

    on_bad="error": raise, naming each bad key and its samples (ids and indices).
    on_bad="drop": return a copy whose `keep` mask is False for every sample with a
    non-finite value anywhere, those samples' values set to 0 (`.num_dropped` and
    `.log()["reward/dropped"]` count them) so the caller can drop them.
    """
    _check_on_bad(on_bad)
    named = {"rewards": result.total, "scores": result.scores,
             **{f"extra_logs/{k}": v for k, v in result.components.items()}}
    bad_by_key = {k: ~torch.isfinite(v) for k, v in named.items()}
    bad = torch.zeros(len(result), dtype=torch.bool)
    for mask in bad_by_key.values():
        bad |= mask
    if not bad.any():
        return result
    ids = list(sample_ids) if sample_ids is not None else list(range(len(result)))
    if on_bad == "error":
        details = "; ".join(
            f"{k}: samples {[ids[i] for i in idx]} (indices {idx})"
            for k, m in bad_by_key.items() if (idx := m.nonzero().flatten().tolist()))
        raise RewardFunctionError(f"reward file {source}: non-finite values in {details}")
    log.warning("reward file %s: dropping %d samples with non-finite rewards: %s",
                source, int(bad.sum()), [ids[i] for i in bad.nonzero().flatten().tolist()])
    zero = lambda t: torch.where(bad, torch.zeros_like(t), t)  # noqa: E731
    return RewardResult(total=zero(result.total), scores=zero(result.scores),
                        components={k: zero(v) for k, v in result.components.items()},
                        keep=result.keep & ~bad)


def call_reward_function(fn: Callable[..., Any], *, queries: Sequence[str],
                         prompts: Sequence[str], labels: Sequence[str],
                         timeout_s: float | None = 30.0, hang_retries: int = 0,
                         sample_ids: Sequence | None = None, source: str | None = None,
                         on_bad: str = "error", **kwargs: Any) -> RewardResult:
    """Call a reward function on N samples and return a validated `RewardResult`.

    kwargs (responses, languages, keywords, finish_reasons, weights, ...) are passed
    where fn's signature accepts them (`accepted_kwargs`): a file that takes only
    (queries, prompts, labels) gets none. `source` names the file in errors (default:
    the function's source file); `sample_ids` name the samples in errors (default:
    their indices). A call that hangs past `timeout_s` is made again up to `hang_retries`
    times (each hung thread keeps running: see `hung_reward_calls`) before `on_bad` decides.
    """
    _check_on_bad(on_bad)     # before running user code, not after
    source = source or _source_of(fn)
    check_signature(fn, source)   # a function not loaded from a file has not been checked
    kwargs = accepted_kwargs(fn, kwargs)
    n = len(queries)
    lengths = {"queries": n, "prompts": len(prompts), "labels": len(labels)}
    if sample_ids is not None:
        lengths["sample_ids"] = len(sample_ids)
    if len(set(lengths.values())) > 1:
        raise ValueError(f"batch fields must have the same length, got {lengths}")
    ids = list(sample_ids) if sample_ids is not None else list(range(n))

    def run(rows: list[int]) -> RewardResult:
        # Positional, as in OpenRLHF's contract: a file may name the three parameters freely.
        per_sample = {k: [v[i] for i in rows] if is_per_sample(v, n) else v for k, v in kwargs.items()}
        for attempt in range(hang_retries + 1):
            try:
                out = _run_with_timeout(fn, timeout_s, source, describe_samples([ids[i] for i in rows], len(rows)),
                                        [queries[i] for i in rows], [prompts[i] for i in rows],
                                        [labels[i] for i in rows], **per_sample)
                return to_reward_result(out, len(rows), source)
            except RewardTimeout as exc:
                if attempt == hang_retries:
                    raise
                log.warning("%s: trying again (%d of %d)", exc, attempt + 1, hang_retries)

    try:
        result = run(list(range(n)))
    except (RewardCallFailed, RewardTimeout) as exc:
        if on_bad == "error":
            raise
        log.warning("%s: dropping the samples it fails on", exc)
        result = _isolate(run, n, exc)
    return sanitize(result, on_bad, sample_ids=sample_ids, source=source)


def is_per_sample(value: Any, n: int) -> bool:
    """A batch field with one value per sample (split with the batch), not one for all (weights)."""
    return isinstance(value, (list, tuple)) and len(value) == n


def _isolate(run: Callable[[list[int]], RewardResult], n: int, first: RewardFunctionError) -> RewardResult:
    """After a failed batch call under on_bad=drop: a hang drops the batch; a raise is
    retried one sample at a time and drops the samples that raise again."""
    if isinstance(first, RewardTimeout) or n == 1:
        return RewardResult.dropped(n)
    parts = []
    for i in range(n):
        try:
            parts.append(run([i]))
        except (RewardCallFailed, RewardTimeout) as exc:
            log.warning("%s: dropped", exc)
            parts.append(RewardResult.dropped(1))
    return RewardResult.cat(parts)
