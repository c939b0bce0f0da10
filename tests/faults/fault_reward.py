"""A reward file that injects faults on command (copied next to a `control.json` by the
fault tests): the built-in ASR reward, except what the control file asks for, read on
every call so a test can switch faults without restarting the worker.

  {"mode": "ok"}                      the built-in reward
  {"mode": "stall_once"}              the first call writes this process's pid to `pid`
                                      and sleeps (to be killed); later calls are "ok"
  {"mode": "slow", "seconds": s}      every call writes this process's pid to `pid` and
                                      sleeps s seconds, then gives the built-in reward
  {"mode": "raise"}                   raise ValueError
  {"mode": "raise_on_first"}          a call of several samples raises and marks its first
                                      sample's reference text; later calls raise when they
                                      hold a sample with that text
  {"mode": "nan_on_first"}            a NaN reward for the first sample of every call
  {"mode": "hang"}                    sleep far past any timeout
"""
import json
import math
import os
import time
from pathlib import Path

from asr_grpo.rewards.asr_reward import reward_func as builtin

HERE = Path(__file__).resolve().parent
_poisoned: set[str] = set()


def reward_func(queries, prompts, labels, **kwargs):
    control = json.loads((HERE / "control.json").read_text())
    mode = control["mode"]
    if mode == "stall_once" and not (HERE / "stalled").exists():
        (HERE / "stalled").touch()
        (HERE / "pid").write_text(str(os.getpid()))
        time.sleep(120)
    if mode == "slow":
        (HERE / "pid").write_text(str(os.getpid()))
        time.sleep(control["seconds"])
    if mode == "raise_on_first" and len(labels) > 1:
        _poisoned.add(labels[0])
    if mode == "raise" or (mode == "raise_on_first" and _poisoned & set(labels)):
        raise ValueError(f"injected failure on {len(labels)} samples")
    if mode == "hang":
        time.sleep(600)
    out = builtin(queries, prompts, labels, **kwargs)
    if mode == "nan_on_first":
        out["rewards"][0] = math.nan
    return out
