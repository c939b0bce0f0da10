"""A trainer killed mid-run (SIGKILL of the policy rank's process) ends the run with a
message naming the checkpoint to resume from; `trainer.resume=true` continues from it
to the end in the same MLflow run. The run reads a manifest with bad lines under
`data.on_bad_audio=skip`: they are skipped and counted as `data/skipped` in MLflow."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from fault_injection import finish, kill_when, own_actor_pids, sigkill
from helpers import compose_cfg, metric_history

from asr_grpo.distributed.faults import TrainerDied
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.recipes.rl import run_rl

pytestmark = [pytest.mark.long, pytest.mark.slow]


def manifests_with_bad_lines(root: Path, folder: Path) -> list[str]:
    """The corpus manifests with absolute audio paths; train gets two bad lines."""
    corpus = next(root.glob("corpus/*/train.jsonl")).parent
    out = []
    for split in ("train", "dev", "test"):
        rows = [json.loads(line) for line in (corpus / f"{split}.jsonl").read_text().splitlines() if line.strip()]
        for r in rows:
            r["audio"] = str(corpus / r["audio"])
        if split == "train":
            rows.insert(3, {**rows[0], "id": "gone", "audio": str(folder / "gone.wav")})
            rows.insert(7, {**rows[1], "id": "cyrillic", "text": "включи свет", "language": "en"})
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        out.append(f"data.{split}_manifest={path}")
    return out


def kill_the_policy() -> None:
    pids = own_actor_pids("PolicyRole")
    assert pids, "found no PolicyRole process of ours"
    for pid in pids:
        sigkill(pid)


def test_trainer_death_ends_the_run_and_resume_continues_from_the_checkpoint(root, tmp_path):
    out = tmp_path / "rl"
    common = [*manifests_with_bad_lines(root, tmp_path), "data.on_bad_audio=skip", "trainer.steps=2",
              "trainer.save_every=1", "trainer.eval_every=0", f"trainer.output_dir={out}"]
    # The moment step 1's checkpoint is in place, the policy's process is killed: step 2 is under way.
    killer = kill_when(lambda: (out / ckpt.LATEST).is_file(), kill_the_policy)
    with pytest.raises(TrainerDied) as err:
        run_rl(compose_cfg(root, *common))
    finish(killer)
    message = str(err.value)
    assert "the trainer died: role 'actor' rank 0 during step 2" in message
    assert (f"rerun with trainer.resume=true trainer.output_dir={out} to continue from {out / 'step_000001'} "
            "(step 1)") in message

    summary = run_rl(compose_cfg(root, *common, "trainer.resume=true"))
    assert summary["steps"] == 2
    cfg = compose_cfg(root)
    run_id = ckpt.read_driver_state(out / "step_000001")["mlflow_run_id"]
    assert summary["mlflow_run_id"] == run_id   # the same MLflow run, continued
    assert [s for s, _ in metric_history(cfg, run_id, "reward/total")] == [1, 2]
    assert ckpt.latest_checkpoint(out) == out / "step_000002"
    assert dict(metric_history(cfg, run_id, "data/skipped")) == {1: 2.0, 2: 2.0}


def test_one_of_two_trainer_ranks_lost_ends_the_run_within_seconds(root, tmp_path):
    """The surviving rank waits in a collective the dead one never joins; the driver does
    not wait with it (the default collective timeout is minutes): TrainerDied names the
    dead rank and the checkpoint within 30 s of the kill."""
    out = tmp_path / "rl2"
    killed: dict = {}

    def kill_one_rank():
        pids = own_actor_pids("PolicyRole")
        assert len(pids) == 2, f"expected 2 PolicyRole processes, found {pids}"
        killed["at"] = time.monotonic()
        sigkill(pids[-1])

    killer = kill_when(lambda: (out / ckpt.LATEST).is_file(), kill_one_rank)
    with pytest.raises(TrainerDied) as err:
        run_rl(compose_cfg(root, "placement.actor_num_ranks=2", "trainer.prompts_per_step=2", "trainer.steps=3",
                           "trainer.save_every=1", "trainer.eval_every=0", f"trainer.output_dir={out}"))
    ended = time.monotonic()
    finish(killer)
    assert ended - killed["at"] < 30, f"the run ended {ended - killed['at']:.0f} s after the rank died"
    assert re.search(r"the trainer died: role 'actor' rank [01] during step \d", str(err.value))
    assert "rerun with trainer.resume=true" in str(err.value)
