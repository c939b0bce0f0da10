"""Trainer -> rollout weight broadcast over a standalone sync group, with a tiny Qwen3
causal LM (tied embeddings). Ranks are subprocesses of this file (see
test_deepspeed_strategy.py for why)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

# Share the rank launcher with the sibling test (test files are not importable by name).
_spec = importlib.util.spec_from_file_location(
    "_ds_strategy_test", Path(__file__).with_name("test_deepspeed_strategy.py"))
_ds_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ds_test)
launch_ranks = _ds_test.launch_ranks

ROUNDS = 2


def load(out: Path, name: str) -> dict:
    return torch.load(out / f"{name}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Both scenarios in one set of 3 processes: start-up and imports (torch,
    transformers, deepspeed: ~20 s a process on a busy 2-core box) are paid once."""
    out = tmp_path_factory.mktemp("sync")
    launch_ranks(__file__, out, str(_ds_test.free_port()), str(_ds_test.free_port()), world=3)
    return out


@pytest.mark.slow
def test_plain_trainer_to_two_rollout_ranks(runs):
    """Rank 0 perturbs and sends (twice: the group is reusable); rank 1 receives into
    fp32, rank 2 into a bf16 copy (cast on receipt)."""
    for rnd in range(ROUNDS):
        sent, got, got16 = (load(runs, f"{who}{rnd}") for who in ("trainer", "rollout1", "rollout2"))
        for name, value in sent["state"].items():
            assert torch.equal(got["state"][name], value), name
            assert torch.equal(got16["state"][name], value.to(torch.bfloat16)), name
        assert torch.equal(got["logits"], sent["logits"])
        assert not torch.allclose(got["logits_before"], sent["logits"])
        assert got["tied"], "lm_head and embed_tokens came apart"


@pytest.mark.slow
def test_zero3_trainer_ranks_to_rollout(runs):
    """Two ZeRO-3 DeepSpeed ranks train a step on different data, gather shard by shard
    and rank 0 broadcasts to a rollout process; the DeepSpeed group keeps working."""
    sent, got = load(runs, "z3_trainer"), load(runs, "z3_rollout")
    for name, value in got["state"].items():
        assert torch.equal(value, sent["state"][name]), name
    assert torch.equal(got["logits"], sent["logits"])
    assert not torch.allclose(got["logits_before"], sent["logits"])
    assert sent["trained_after_sync"]


# ------------------------------------------------------------------ rank worker --
def tiny_lm():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        tie_word_embeddings=True)).eval()


INPUT = torch.arange(12).reshape(2, 6) % 64


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(input_ids=INPUT).logits.float()


def snapshot(model, **extra) -> dict:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"state": state, "logits": logits(model), **extra}


def plain(rank: int, world: int, port: int, out: Path) -> None:
    """Sync group of all 3 processes, no DeepSpeed."""
    from asr_grpo.distributed.weight_sync import WeightSyncGroup

    model = tiny_lm()
    if rank == 2:
        model = model.to(torch.bfloat16)
    group = WeightSyncGroup.create("127.0.0.1", port, rank, world, "gloo")
    for rnd in range(ROUNDS):
        if rank == 0:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            group.broadcast_model(model)
            torch.save(snapshot(model), out / f"trainer{rnd}.pt")
        else:
            before = logits(model)
            group.receive_model(model)
            tied = model.lm_head.weight is model.model.embed_tokens.weight
            torch.save(snapshot(model, logits_before=before, tied=tied), out / f"rollout{rank}{rnd}.pt")


def zero3(rank: int, port: int, out: Path, sync_port: int) -> None:
    """Ranks 0, 1: DeepSpeed default group (on `port`); rank 2: rollout."""
    from asr_grpo.config.schema import TrainerConfig
    from asr_grpo.distributed.deepspeed_strategy import TrainingEngine, init_distributed, shutdown_distributed
    from asr_grpo.distributed.weight_sync import WeightSyncGroup, broadcast_model

    if rank == 2:  # the rollout process: no default group at all
        model = tiny_lm()
        before = logits(model)
        WeightSyncGroup.create("127.0.0.1", sync_port, 1, 2, "gloo").receive_model(model)
        torch.save(snapshot(model, logits_before=before), out / "z3_rollout.pt")
        return

    def train_step():
        ids = torch.randint(64, (2, 8), generator=torch.Generator().manual_seed(rank))
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        return engine.step()

    init_distributed(rank, 2, "127.0.0.1", port)
    engine = TrainingEngine(tiny_lm(), TrainerConfig(zero_stage=3, micro_batch_size=2, lr=1e-2,
                                                     lr_warmup_steps=0, num_threads=1)).train()
    train_step()
    group = WeightSyncGroup.create("127.0.0.1", sync_port, 0, 2, "gloo") if rank == 0 else None
    broadcast_model(engine.module, 3, group)
    state = engine.full_state_dict()
    trained_after_sync = train_step()  # the DeepSpeed group is intact
    if rank == 0:
        model = tiny_lm()
        model.load_state_dict(state)
        torch.save(snapshot(model, trained_after_sync=trained_after_sync), out / "z3_trainer.pt")
    shutdown_distributed()


if __name__ == "__main__":
    torch.set_num_threads(1)
    r, w, p, o, plain_port, zero3_port = sys.argv[1:]
    plain(int(r), int(w), int(plain_port), Path(o))
    zero3(int(r), int(p), Path(o), int(zero3_port))
