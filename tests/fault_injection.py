"""Fault-injection helpers (tests/faults): bad data files, a switchable faulty reward
file, killing our own Ray actors' processes at a chosen moment, and the sockets our
process tree listens on."""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import soundfile as sf

SR = 16000


def tone(seconds: float, sr: int = SR, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return x if channels == 1 else np.stack([x, 0.5 * x], 1)


def write_wav(folder, name: str, audio: np.ndarray, sr: int = SR, subtype: str | None = None) -> str:
    sf.write(folder / name, audio, sr, subtype=subtype)
    return name


def row(uid: str, audio: str, duration: float = 1.0, **overrides) -> dict:
    """A manifest line (English, 1 s unless told); `field=...` drops a field."""
    out = {"id": uid, "audio": audio, "text": "turn on the lights", "language": "en",
           "keywords": ["lights"], "duration": duration, **overrides}
    return {k: v for k, v in out.items() if v is not ...}


def corrupt(folder) -> str:
    """A WAV whose header is cut short: libsndfile cannot read it."""
    (folder / "corrupt.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt " + bytes(40))
    return "corrupt.wav"


def write_manifest(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


class FaultReward:
    """A copy of fault_reward.py with its control file; `set(mode, **kw)` switches it."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.path = str(folder / "fault_reward.py")
        shutil.copy(Path(__file__).parent / "faults" / "fault_reward.py", self.path)
        self.set("ok")

    def set(self, mode: str, **kw) -> None:
        for marker in ("pid", "stalled"):
            (self.folder / marker).unlink(missing_ok=True)
        (self.folder / "control.json").write_text(json.dumps({"mode": mode, **kw}))

    def stalled_pid(self, timeout_s: float = 120.0) -> int:
        return int(wait_for(lambda: (self.folder / "pid").is_file() and (self.folder / "pid").read_text(),
                            timeout_s, "the reward worker to stall"))


def wait_for(condition, timeout_s: float, what: str, period_s: float = 0.005, cancel=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (cancel is not None and cancel.is_set()):
        value = condition()
        if value:
            return value
        time.sleep(period_s)
    raise TimeoutError(f"gave up waiting for {what}")


def kill_when(condition, kill, timeout_s: float = 600.0) -> dict:
    """In a background thread: once `condition()` is true, run `kill()`. Returns a dict
    that gets `done: True` (or `error`) when it has; `finish(state)` ends the wait."""
    state: dict = {"cancel": threading.Event()}

    def run():
        try:
            wait_for(condition, timeout_s, "the moment to kill", cancel=state["cancel"])
            kill()
            state["done"] = True
        except Exception as exc:   # reported by the test, not lost in the thread
            state["error"] = exc

    state["thread"] = threading.Thread(target=run, daemon=True)
    state["thread"].start()
    return state


def finish(state: dict) -> None:
    """Stop waiting (a kill that has not happened never will) and require that it did."""
    state["cancel"].set()
    state["thread"].join(timeout=60)
    assert state.get("done"), state.get("error", "the kill never happened")


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def own_processes() -> list[psutil.Process]:
    """This process and everything it started (Ray's GCS, raylet and workers included)."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def own_actor_pids(class_name: str) -> list[int]:
    """Our own Ray worker processes currently hosting an actor of `class_name` (Ray sets
    the process title to `ray::<Class>` or `ray::<Class>.<method>`)."""
    out = []
    for p in own_processes():
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if title.startswith(f"ray::{class_name}"):
            out.append(p.pid)
    return out


def listening_addresses() -> dict[str, set[str]]:
    """Process name -> the addresses its listening TCP sockets are bound to, over our
    whole process tree."""
    out: dict[str, set[str]] = {}
    for p in own_processes():
        try:
            conns = p.net_connections(kind="tcp")
            name = " ".join(p.cmdline())[:60] or p.name()
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.setdefault(name, set()).add(c.laddr.ip)
    return out



class Payload:
    """Unpickling this runs `Path(marker).touch()`: code hidden in a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def armed_checkpoint(path: Path, marker: Path) -> Path:
    """A torch checkpoint file that creates `marker` when unpickled."""
    import torch

    torch.save({"optimizer_state_dict": {"state": torch.zeros(2)}, "extra": Payload(marker)}, path)
    return path
