"""Worker death: which roles Ray restarts, how a restarted actor says it lost its state,
and the error that ends a run when a trainer dies.

Stateless or reloadable roles (reference, LM reward model, reward workers, rollout
workers) are created with `max_restarts=-1, max_task_retries=-1`: Ray re-runs the
constructor after a crash and re-submits the calls that were in flight. What a restart
cannot bring back, the driver re-issues from its own state: the scheduler keeps every
sequence's latest tokens (a restarted rollout worker gets the current weights and its
unfinished sequences back), and the experience maker re-scores in one shot what a
restarted streaming scorer had in its caches. A restarted actor refuses calls that need
the lost state with `WorkerRestarted` until the driver has restored it.

Trainer roles (policy, critic) hold optimizer state and a DeepSpeed process group that
no restart recovers: their death ends the run with `TrainerDied`, which names the
last checkpoint that `trainer.resume=true` continues from.
"""
from __future__ import annotations

import functools
import warnings
from pathlib import Path

from asr_grpo.config.errors import first_line

RESTARTABLE_ROLES = frozenset({"ref", "reward_model", "reward", "rollout"})


def restart_options(role: str) -> dict:
    """Ray actor options for a role: automatic restarts for the restartable ones."""
    if role in RESTARTABLE_ROLES:
        return {"max_restarts": -1, "max_task_retries": -1}
    return {"max_restarts": 0, "max_task_retries": 0}


class WorkerRestarted(RuntimeError):
    """A restarted actor was asked for state it lost with its process."""


class TrainerDied(RuntimeError):
    """A trainer actor (policy or critic rank) died: the run cannot continue."""


@functools.cache
def was_restarted() -> bool:
    """Inside a Ray actor: whether this process is a restart of the actor (asked of the
    GCS once per process: a restart is a new process). False outside an actor."""
    import ray

    ctx = ray.get_runtime_context()
    if not ray.is_initialized() or ctx.get_actor_id() is None:
        return False
    with warnings.catch_warnings():   # Ray's own property reads its deprecated `actor_id`
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ctx.was_current_actor_reconstructed)


class RestartAware:
    """Mixin for actors with state the driver must put back after a restart."""

    _restored = False

    def refuse_if_restarted(self, what: str) -> None:
        if not self._restored and was_restarted():
            raise WorkerRestarted(f"{type(self).__name__} was restarted and lost {what}; "
                                  f"the driver restores it before new work")

    def mark_restored(self) -> None:
        self._restored = True


def is_actor_death(exc: BaseException) -> bool:
    """An error meaning an actor's process died or restarted (not an error of its code)."""
    from ray.exceptions import RayActorError

    return isinstance(exc, (RayActorError, WorkerRestarted))


def trainer_died_message(role: str, rank: int, step: int, cause: BaseException,
                         checkpoint: str | None, checkpoint_step: int | None) -> str:
    where = (f"rerun with trainer.resume=true trainer.output_dir={Path(checkpoint).parent} to continue from "
             f"{checkpoint} (step {checkpoint_step})"
             if checkpoint else "no checkpoint was written yet (trainer.save_every): rerun from the start")
    return (f"the trainer died: role {role!r} rank {rank} during step {step + 1} ({first_line(cause)}). "
            f"Its optimizer state and process group cannot be restarted, so the run stops; {where}.")
