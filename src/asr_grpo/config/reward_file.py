"""Loading a reward file (`reward.reward_file`) and checking `reward_func`'s signature.

Lives with the config, as `engines.py` does, because validation loads the file before
Ray starts and the config layer imports nothing above it; `asr_grpo.rewards.loader`
re-exports all of it and does the calling.
"""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
from pathlib import Path
from typing import Any, Callable

# A file of the rewards package, named by path: importing it here would go up the layers.
BUILTIN_REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "asr_reward.py"
# Every keyword argument the toolkit passes to reward_func (asr_grpo.experience.maker
# reward_batch, asr_grpo.workers.reward): weights, lm_scores and durations only sometimes.
TOOLKIT_KWARGS = ("responses", "languages", "keywords", "finish_reasons", "weights", "lm_scores", "durations")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_module_ids = itertools.count()


class RewardFunctionError(RuntimeError):
    """A reward file could not be loaded, failed, hung or returned something unusable."""


def load_reward_function(path: str | None) -> Callable[..., Any]:
    """Import `reward_func` from a Python file (None or "" -> the built-in ASR reward)
    and refuse a signature the toolkit's call cannot fit.

    Each load gets a fresh, unique module name, so two files called `reward.py` (or
    the same file reloaded after an edit) never shadow each other.
    """
    file = Path(path) if path else BUILTIN_REWARD_FILE
    if not file.is_file():
        raise RewardFunctionError(f"reward file {file}: not found")
    name = f"asr_grpo_reward_file_{next(_module_ids)}_{file.stem}"
    try:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module      # dataclasses/pickle look the module up by name
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise RewardFunctionError(
            f"reward file {file}: import failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, "reward_func", None)
    if not callable(fn):
        raise RewardFunctionError(f"reward file {file}: defines no callable `reward_func`")
    check_signature(fn, str(file))
    return fn


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):   # some builtins and C callables have none to read
        return None


def _bound_by_position(sig: inspect.Signature) -> list[inspect.Parameter]:
    """The parameters that receive queries, prompts and labels (passed positionally, as
    in OpenRLHF's contract, so a file may name them freely)."""
    return [p for p in sig.parameters.values() if p.kind in _POSITIONAL][:3]


def check_signature(fn: Callable, source: str) -> None:
    """Raise `RewardFunctionError` (one line, naming `source`) unless
    fn(queries, prompts, labels, **accepted_kwargs(...)) can bind: three positional
    parameters (or *args), and no required parameter the toolkit never passes."""
    sig = _signature(fn)
    if sig is None:
        return      # nothing to read: a bad call still fails, naming the file
    params = list(sig.parameters.values())
    first = _bound_by_position(sig)
    if len(first) < 3 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise RewardFunctionError(
            f"reward file {source}: reward_func{sig} takes {len(first)} positional parameter"
            f"{'s' if len(first) != 1 else ''}; it must take (queries, prompts, labels) positionally")
    # Past the first three only keywords are passed, and only the toolkit's names.
    never = [p.name for p in params if p not in first and p.default is p.empty
             and (p.kind is p.POSITIONAL_ONLY
                  or (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in TOOLKIT_KWARGS))]
    if never:
        raise RewardFunctionError(
            f"reward file {source}: reward_func{sig} requires {', '.join(never)}, which the toolkit "
            f"never passes (it passes queries, prompts, labels positionally and {', '.join(TOOLKIT_KWARGS)} "
            "by name): give them defaults or take **kwargs")


def accepted_kwargs(fn: Callable, kwargs: dict) -> dict:
    """The entries of `kwargs` fn's signature accepts beside (queries, prompts, labels):
    all of them with **kwargs, else those it names. A name that the three positional
    arguments already bind is left out (it would be given twice). An unreadable
    signature gets all of them."""
    sig = _signature(fn)
    if sig is None:
        return dict(kwargs)
    params = sig.parameters.values()
    taken = {p.name for p in _bound_by_position(sig) if p.kind is p.POSITIONAL_OR_KEYWORD}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return {k: v for k, v in kwargs.items() if k not in taken}
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - taken
    return {k: v for k, v in kwargs.items() if k in named}
