"""Two DeepSpeed data-parallel ranks on CPU (gloo): replicas agree, frozen weights stay
put, gradient accumulation equals the doubled micro-batch, a resumed run equals the
uninterrupted one.

Ranks run as plain subprocesses of this very file (`python <file> <rank> ...`): pytest's
importlib mode leaves test modules unimportable by name, which rules out
multiprocessing's spawn.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asr_grpo.config.schema import TrainerConfig
from asr_grpo.distributed.deepspeed_strategy import deepspeed_config, trained_precision
from asr_grpo.distributed.net import free_port

WORLD = 2
K, J = 2, 2          # checkpoint after K optimizer steps, then J more
MICRO, ACCUM = 2, 2  # run A; run B uses one micro-batch of MICRO * ACCUM
CFG = dict(lr=1e-2, lr_warmup_steps=1, lr_scheduler="cosine", weight_decay=0.1,
           grad_clip=0.5, num_threads=1, steps=6)


def launch_ranks(script: str, out: Path, *args: str, world: int = WORLD, timeout: int = 600) -> None:
    """Run `script` once per rank as `script RANK WORLD PORT OUT *args`; fail with the
    ranks' stderr if any exits non-zero."""
    port = str(free_port())
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), port, str(out), *args],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [(r, log) for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode]
    assert not failed, "\n".join(f"--- rank {r} ---\n{log[-4000:]}" for r, log in failed)


# ---------------------------------------------------------------- config (fast) --
def test_config_batch_sizes_and_flags():
    cfg = deepspeed_config(TrainerConfig(micro_batch_size=3, grad_accum_steps=4, zero_stage=2), 2)
    assert cfg["train_batch_size"] == 24
    assert cfg["train_micro_batch_size_per_gpu"] == 3 and cfg["gradient_accumulation_steps"] == 4
    assert cfg["zero_optimization"] == {"stage": 2}
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["zero_allow_untested_optimizer"] is True


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_config_keeps_fp32_master_weights_and_accumulates_in_fp32(stage):
    """model.dtype=bfloat16: loaded in fp32, DeepSpeed's bf16 mode on (bf16 compute, fp32
    master weights at every stage); fp32 gradient accumulation where DeepSpeed has it
    (ZeRO 1-3: stage 0 with fp32 accumulation is NotImplementedError in DeepSpeed)."""
    assert trained_precision("bfloat16") == ("float32", True)
    assert trained_precision("float32") == ("float32", False)
    cfg = deepspeed_config(TrainerConfig(zero_stage=stage), 1, bf16=True)
    assert cfg["bf16"] == {"enabled": True} and not cfg["fp16"]["enabled"]
    assert cfg.get("data_types") == ({"grad_accum_dtype": "fp32"} if stage else None)
    assert "data_types" not in deepspeed_config(TrainerConfig(zero_stage=stage), 1)


@pytest.mark.parametrize("key,value", [("zero_stage", 4), ("micro_batch_size", 0),
                                       ("grad_accum_steps", 0), ("lr_scheduler", "step"),
                                       ("grad_clip", -1.0), ("lr", 0.0)])
def test_config_rejects_bad_values_naming_the_key(key, value):
    with pytest.raises(ValueError, match=f"trainer.{key}"):
        deepspeed_config(TrainerConfig(**{key: value}), 2)


# ---------------------------------------------------------- 2 ranks (slow) --
STAGES = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One pair of rank processes trains every ZeRO stage in turn: process start-up and
    imports (~20 s on a busy 2-core box) dominate, so they are paid once."""
    out = tmp_path_factory.mktemp("ds")
    launch_ranks(__file__, out, ",".join(map(str, STAGES)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_two_rank_training(stage, runs):
    res = [torch.load(runs / f"stage{stage}_rank{r}.pt") for r in range(WORLD)]
    r0 = res[0]
    init, final = r0["init"], r0["A"]
    for name in init:
        if name.startswith("encoder."):
            assert torch.equal(final[name], init[name]), f"frozen {name} changed"
        else:
            assert not torch.allclose(final[name], init[name]), f"{name} did not train"
    for name in final:
        # Replicas agree (below ZeRO-3 each rank returns its own full copy).
        assert torch.equal(res[1]["A"][name], final[name]), name
        # grad_accum_steps=2 x micro 2 == one micro-batch of 4 (loss is a per-sample mean).
        torch.testing.assert_close(r0["B"][name], final[name], rtol=1e-5, atol=1e-6)
        # Resume at step K, J more steps == the uninterrupted run.
        torch.testing.assert_close(r0["C"][name], final[name], rtol=0, atol=1e-6)
    assert r0["steps_C"] == K + J and r0["client_state"] == {"rl_step": K}
    assert r0["lrs_C"] == r0["lrs_A"][K:], "scheduler state not resumed"
    if stage > 0:
        assert all(n is not None and n > 0 for n in r0["norms_A"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_weight_average_on_every_zero_stage(stage, runs):
    """The average, swapped in and gathered, equals the EMA of the full weights computed
    here step by step (under ZeRO-3 each rank averaged only its own partition); the engine's
    own weights come back exactly; the frozen encoder is not averaged."""
    from asr_grpo.distributed.ema import warmed_decay

    for r in range(WORLD):
        run = torch.load(runs / f"stage{stage}_rank{r}.pt")["ema"]
        snaps = run["snapshots"]
        assert run["trained"] == sorted(k for k in snaps[0] if not k.startswith("encoder."))
        for name in snaps[0]:
            expected = snaps[0][name].float()
            if name in run["trained"]:
                for t, weights in enumerate(snaps[1:]):
                    expected = expected.lerp(weights[name].float(), 1 - warmed_decay(run["decay"], t))
                assert not torch.allclose(expected, snaps[-1][name]), name   # lags the trained weights
            torch.testing.assert_close(run["averaged"][name], expected, rtol=0, atol=1e-6, msg=name)
            assert torch.equal(run["after"][name], snaps[-1][name]), name


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ds_bf16")
    launch_ranks(__file__, out, "bf16", world=1)
    return torch.load(out / "bf16.pt")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_bf16_mode_keeps_updates_too_small_for_bf16(stage, bf16_run):
    """Weights at 1.0 and Adam steps of 1e-3 down: each step is under half a bf16 ulp
    below 1.0 (2^-9), so pure bf16 weights (the old `model.dtype=bfloat16`) never move,
    while DeepSpeed's bf16 mode sums the steps in its fp32 master weights and the bf16
    weights follow."""
    run = bf16_run[f"stage{stage}"]
    assert run["dtype"] == torch.bfloat16 and run["master_dtype"] == torch.float32
    assert torch.equal(bf16_run["pure_bf16"], torch.ones_like(bf16_run["pure_bf16"]))
    # 16 steps of ~1e-3 from 1.0: ~0.984, within a bf16 ulp (2^-8).
    assert ((run["weight"] - (1.0 - 16e-3)).abs() <= 2**-8).all()


@pytest.mark.slow
def test_bf16_policy_trains_with_gradient_checkpointing(bf16_run):
    """The tiny Qwen3-ASR policy, loaded in fp32, through TrainingEngine with bf16 and
    trainer.gradient_checkpointing: its fp32 features reach the bf16 encoder, the loss is
    finite, the trainable weights move, the frozen encoder does not, the buffers stay fp32,
    and the layers are checkpointed."""
    r = bf16_run["policy"]
    assert r["param_dtypes"] == {torch.bfloat16} and r["buffer_dtypes"] == {torch.float32}
    assert r["checkpointed"] and all(map(math.isfinite, r["losses"]))
    assert r["trained_moved"] and not r["frozen_moved"]


# ------------------------------------------------------------------ rank worker --
class Net(torch.nn.Module):
    """A frozen 'encoder' in front of a small trainable body (like the frozen audio
    encoder of the ASR model)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(8, 16)
        self.encoder.requires_grad_(False)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16),
                                        torch.nn.Tanh(), torch.nn.Linear(16, 4))

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.body(self.encoder(x)), y)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Different data per rank and step, MICRO * ACCUM samples."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(MICRO * ACCUM, 8, generator=g), torch.randn(MICRO * ACCUM, 4, generator=g)


def train(engine, rank: int, steps: range, micro: int) -> tuple[list, list]:
    norms, lrs = [], []
    for step in steps:
        x, y = batch(rank, step)
        for i in range(0, len(x), micro):
            engine.backward(engine(x[i:i + micro], y[i:i + micro]))
            if engine.step():
                norms.append(engine.global_grad_norm)
                lrs.append(engine.lr)
    return norms, lrs


def worker(rank: int, world: int, port: int, out: Path, stages: list[int]) -> None:
    from asr_grpo.distributed.deepspeed_strategy import init_distributed, shutdown_distributed

    init_distributed(rank, world, "127.0.0.1", port)
    for stage in stages:
        torch.save(run_stage(rank, out / f"ckpt{stage}", stage), out / f"stage{stage}_rank{rank}.pt")
    shutdown_distributed()


def run_stage(rank: int, ckpt: Path, stage: int) -> dict:
    """Run A (accumulation, checkpoint at K), B (doubled micro-batch), C (resumed A)."""
    from asr_grpo.distributed.deepspeed_strategy import TrainingEngine

    cfg_a = TrainerConfig(zero_stage=stage, micro_batch_size=MICRO, grad_accum_steps=ACCUM, **CFG)
    cfg_b = TrainerConfig(zero_stage=stage, micro_batch_size=MICRO * ACCUM, grad_accum_steps=1,
                          **CFG)
    res = {}

    a = TrainingEngine(Net(), cfg_a)
    res["init"] = a.full_state_dict(rank0_only=False)
    norms, lrs = train(a, rank, range(K), MICRO)
    a.save_checkpoint(str(ckpt), tag="k", client_state={"rl_step": K})
    more_norms, more_lrs = train(a, rank, range(K, K + J), MICRO)
    res["norms_A"], res["lrs_A"] = norms + more_norms, lrs + more_lrs
    res["A"] = a.full_state_dict(rank0_only=False)

    b = TrainingEngine(Net(), cfg_b)
    train(b, rank, range(K + J), MICRO * ACCUM)
    res["B"] = b.full_state_dict(rank0_only=False)

    c = TrainingEngine(Net(), cfg_a)
    res["client_state"] = {k: v for k, v in c.load_checkpoint(str(ckpt), "k").items()
                           if k == "rl_step"}
    _, res["lrs_C"] = train(c, rank, range(K, K + J), MICRO)
    res["steps_C"] = c.global_steps
    res["C"] = c.full_state_dict(rank0_only=False)
    res["ema"] = weight_average_run(rank, stage)
    return res


def weight_average_run(rank: int, stage: int, decay: float = 0.5) -> dict:
    """Run D: a WeightEma over the engine's parameters (ZeRO-3: each rank's partition),
    the full weights after every optimizer step, and the average swapped in and gathered."""
    from asr_grpo.distributed.deepspeed_strategy import TrainingEngine
    from asr_grpo.distributed.ema import WeightEma

    d = TrainingEngine(Net(), TrainerConfig(zero_stage=stage, micro_batch_size=MICRO * ACCUM, **CFG))
    ema = WeightEma(d.module, decay)
    snapshots = [d.full_state_dict(rank0_only=False)]
    for step in range(3):
        x, y = batch(rank, step)
        d.backward(d(x, y))
        d.step()
        ema.update()
        snapshots.append(d.full_state_dict(rank0_only=False))
    with ema.applied():
        averaged = d.full_state_dict(rank0_only=False)
    return {"snapshots": snapshots, "averaged": averaged, "after": d.full_state_dict(rank0_only=False),
            "trained": sorted(ema.shadow), "decay": decay}


class Ones(torch.nn.Module):
    """One bf16-sized step below 1.0 is 2^-8: weights at 1.0 show whether small updates survive."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4, bias=False)
        torch.nn.init.ones_(self.lin.weight)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.lin(x.to(self.lin.weight.dtype)).float(), y)


def bf16_worker(port: int, out: Path) -> None:
    from asr_grpo.distributed.deepspeed_strategy import TrainingEngine, init_distributed, shutdown_distributed

    init_distributed(0, 1, "127.0.0.1", port)
    cfg = dict(lr=1e-3, lr_warmup_steps=0, lr_scheduler="constant", grad_clip=0.0, num_threads=1, steps=16,
               micro_batch_size=2, grad_accum_steps=2)
    g = torch.Generator().manual_seed(0)
    # Positive inputs, targets far below: every weight's gradient is positive, every step down.
    data = [(torch.rand(2, 16, generator=g), torch.randn(2, 4, generator=g) - 20.0) for _ in range(32)]
    res = {}
    for stage in (0, 1, 2):
        engine = TrainingEngine(Ones(), TrainerConfig(zero_stage=stage, **cfg), bf16=True)
        for x, y in data:
            engine.backward(engine(x, y))
            engine.step()
        opt = engine.engine.optimizer
        masters = [getattr(opt, a) for a in ("fp32_groups", "fp32_groups_flat_partition",
                                             "single_partition_of_fp32_groups") if hasattr(opt, a)]
        flat = masters[0][0]
        res[f"stage{stage}"] = {"dtype": engine.module.lin.weight.dtype,
                                "master_dtype": (flat[0] if isinstance(flat, list) else flat).dtype,
                                "weight": engine.module.lin.weight.detach().float().clone()}
    pure = Ones().bfloat16()   # the old path: a bf16 model, DeepSpeed's bf16 mode off
    engine = TrainingEngine(pure, TrainerConfig(zero_stage=0, **cfg))
    for x, y in data:
        engine.backward(engine(x, y))
        engine.step()
    res["pure_bf16"] = engine.module.lin.weight.detach().float().clone()
    res["policy"] = bf16_policy(cfg)
    torch.save(res, out / "bf16.pt")
    shutdown_distributed()


def bf16_policy(cfg: dict) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: helpers
    from helpers import TINY_MODEL, TINY_TEXTS, noise_audio

    from asr_grpo.config.schema import AlgorithmConfig
    from asr_grpo.distributed.deepspeed_strategy import TrainingEngine
    from asr_grpo.experience.losses import actor_loss
    from asr_grpo.experience.types import ExperienceItem
    from asr_grpo.models import build_model, build_processor, set_audio_encoder_frozen, train_tokenizer
    from asr_grpo.models.sequences import encode_prompt

    tok = train_tokenizer(TINY_TEXTS, vocab_size=400)
    model = build_model(TINY_MODEL, tok, seed=0)   # fp32, as trained_precision("bfloat16") loads it
    set_audio_encoder_frozen(model, True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = TrainingEngine(model, TrainerConfig(zero_stage=1, gradient_checkpointing=True,
                                                 **{**cfg, "grad_accum_steps": 1}), bf16=True)
    prompt, feats = encode_prompt(build_processor(tok), noise_audio(1.0, 0), "en")
    response = tok("call alice")["input_ids"] + [tok.eos_token_id]
    n = len(response)
    items = [ExperienceItem(uid=f"u#{k}", group="u", prompt_ids=prompt, response_ids=response, features=feats,
                            advantages=torch.full((n,), 1.0 - 2 * k), old_logprobs=torch.full((n,), -3.0),
                            behaviour_logprobs=torch.full((n,), -3.0)) for k in range(2)]
    losses = []
    engine.train()
    for _ in range(3):
        loss, _ = actor_loss(engine, items, AlgorithmConfig(kl_coef=0.0), tok.pad_token_id)
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    module = engine.module
    # Against the weights as DeepSpeed's bf16 mode received them (rounded to bf16).
    moved = {n: not torch.equal(p.detach(), before[n].to(p.device, p.dtype)) for n, p in module.named_parameters()}
    return {"param_dtypes": {p.dtype for p in module.parameters()},
            "buffer_dtypes": {b.dtype for b in module.buffers() if b.is_floating_point()},
            "checkpointed": module.model.language_model.layers[0].gradient_checkpointing,
            "losses": losses,
            "trained_moved": any(v for n, v in moved.items() if "audio_tower" not in n),
            "frozen_moved": any(v for n, v in moved.items() if "audio_tower" in n)}


if __name__ == "__main__":
    r, w, p, o, s = sys.argv[1:6]
    if s == "bf16":
        bf16_worker(int(p), Path(o))
    else:
        worker(int(r), int(w), int(p), Path(o), [int(x) for x in s.split(",")])
