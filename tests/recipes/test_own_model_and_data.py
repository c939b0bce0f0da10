"""A user's own checkpoint and corpus: a Qwen3-ASR saved with plain `save_pretrained`
(no project files) and a NeMo-style German manifest; SFT and RL each start from that
checkpoint, train a few steps and log held-out CER, per language included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY_MODEL, compose_cfg, metric_history

from asr_grpo.models import build_model, build_processor, train_tokenizer
from asr_grpo.models.checkpoint import COMPLETE_MARKER
from asr_grpo.recipes.rl import run_rl
from asr_grpo.recipes.sft import run_sft

GERMAN = Path(__file__).resolve().parents[2] / "examples" / "manifests" / "de.jsonl"


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory):
    texts = GERMAN.read_text().splitlines() * 5 + ["guten tag", "danke schön"] * 10
    tokenizer = train_tokenizer(texts, 300, languages=("de", "en"))
    path = tmp_path_factory.mktemp("user") / "my-qwen3-asr"
    build_model(TINY_MODEL, tokenizer).save_pretrained(path)
    build_processor(tokenizer).save_pretrained(path)
    assert not (path / COMPLETE_MARKER).exists()
    return path


def own(root, checkpoint, *overrides):
    manifests = [f"data.{split}_manifest={GERMAN}" for split in ("train", "dev", "test")]
    return compose_cfg(root, f"model.path={checkpoint}", *manifests, *overrides)


@pytest.mark.slow
def test_sft_fine_tunes_a_plain_checkpoint_on_a_german_manifest(tmp_path, plain_checkpoint):
    summary = run_sft(own(tmp_path, plain_checkpoint, "sft=finetune", "sft.ctc_warmup_steps=0", "sft.max_steps=3"))
    assert summary["steps"] == 3 and set(summary["dev"]) >= {"cer", "cer/de"}
    assert summary["dev"]["cer"] == summary["dev"]["cer/de"]   # one language: the same utterances
    # The tokenizer came with the checkpoint: SFT trained none of its own.
    vocab = [json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
             for folder in (Path(summary["checkpoint"]), plain_checkpoint)]
    assert vocab[0] == vocab[1]


@pytest.mark.slow
def test_rl_starts_from_a_plain_checkpoint_and_logs_held_out_cer(tmp_path, plain_checkpoint):
    cfg = own(tmp_path, plain_checkpoint, "trainer.steps=2", "trainer.eval_every=1")
    summary = run_rl(cfg)
    assert summary["steps"] == 2 and "cer/de" in summary["eval_after"]
    assert not (tmp_path / "checkpoints" / "sft-debug-fast").exists()   # no SFT was needed
    cer = metric_history(cfg, summary["mlflow_run_id"], "eval/cer/de")
    assert [step for step, _ in cer] == [0, 1, 2]
