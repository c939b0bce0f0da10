"""LoRA on the tiny Qwen3-ASR (models/lora.py): which modules it wraps and trains, the
reference as the base with the adapters off (sharing its weights), the weights a sync
sends (adapters alone, or merged in) and the merged export."""
from __future__ import annotations

import copy
import re
import threading

import pytest
import torch
from helpers import noise_audio

from asr_grpo.config.schema import LM_PROJECTIONS, LoraConfig
from asr_grpo.distributed.net import free_port
from asr_grpo.distributed.weight_sync import WeightSyncGroup, broadcast_tensors, model_tensors
from asr_grpo.models import load_model
from asr_grpo.models.lora import (
    ADAPTER_DIR,
    adapter_tensors,
    apply_lora,
    merged_tensors,
    save_model_checkpoint,
)
from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logits, response_logprobs

ENCODER_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]


def lora_cfg(**kw) -> LoraConfig:
    return LoraConfig(rank=4, alpha=8.0, **kw)


@pytest.fixture
def base(tiny_model):
    return copy.deepcopy(tiny_model)   # the session's model stays unwrapped


@pytest.fixture(scope="module")
def batch(tiny_processor, tiny_tokenizer):
    prompt, feats = encode_prompt(tiny_processor, noise_audio(1.0, 0), "en")
    words = tiny_tokenizer("call alice at five")["input_ids"]
    return pack_sequences([prompt, prompt], [words, words[:2]], [feats, feats], tiny_tokenizer.pad_token_id)


@torch.no_grad()
def logits(model, batch) -> torch.Tensor:
    model.eval()
    return response_logits(model, batch).float()


def train_step(model, batch, lr: float = 0.05) -> None:
    """One SGD step on the trainable weights (the adapters), as a policy update would."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    loss = -response_logprobs(model, batch).sum()
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad.sign()
            p.grad = None


def lora_modules(model) -> set[str]:
    from peft.tuners.lora import LoraLayer

    return {name for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def test_off_by_default_wraps_nothing(base):
    assert apply_lora(base, LoraConfig()) is None
    assert not lora_modules(base)


def test_default_adapts_the_language_models_projections_only(base):
    linear = {n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)}
    peft_model = apply_lora(base, lora_cfg())
    wrapped = lora_modules(base)
    expected = {n for n in linear if n.startswith("model.language_model.layers.") and n.rsplit(".", 1)[1] in LM_PROJECTIONS}
    assert wrapped == expected and len(expected) == 2 * len(LM_PROJECTIONS)   # 2 decoder layers
    trainable = [n for n, p in base.named_parameters() if p.requires_grad]
    assert trainable and all(re.search(r"\.lora_[AB]\.default\.weight$", n) for n in trainable)
    assert len(trainable) == 2 * len(expected)
    assert peft_model.get_base_model() is base   # wrapped in place: the code keeps its model


def test_encoder_targets_and_the_audio_adapter_are_options(base):
    apply_lora(base, lora_cfg(target_modules=["q_proj"], encoder_target_modules=ENCODER_PROJECTIONS,
                              train_audio_adapter=True))
    wrapped = lora_modules(base)
    assert {n for n in wrapped if "audio_tower" in n} == {f"model.audio_tower.layers.0.{p}" for p in
                                                          ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                           "self_attn.out_proj", "fc1", "fc2"]}
    assert {n for n in wrapped if "language_model" in n} == {f"model.language_model.layers.{i}.self_attn.q_proj"
                                                             for i in range(2)}
    trainable = {n for n, p in base.named_parameters() if p.requires_grad}
    projector = {n for n in trainable if "multi_modal_projector" in n}
    assert projector == {f"model.multi_modal_projector.modules_to_save.default.linear_{i}.{w}"
                         for i in (1, 2) for w in ("weight", "bias")}
    assert all("lora_" in n for n in trainable - projector)


def test_reference_is_the_base_with_adapters_off_and_shares_its_weights(base, tiny_model, batch):
    storages = {p.untyped_storage().data_ptr() for p in base.parameters()}
    peft_model = apply_lora(base, lora_cfg(train_audio_adapter=True))
    before = logits(base, batch)
    train_step(base, batch)
    trained = logits(base, batch)
    with peft_model.disable_adapter():
        reference = logits(base, batch)
    base_logits = logits(tiny_model, batch)   # the unwrapped model, a separate copy
    torch.testing.assert_close(before, base_logits, rtol=0, atol=1e-6)   # lora_B starts at zero
    assert (trained - base_logits).abs().max() > 1e-2                     # the step moved the policy
    torch.testing.assert_close(reference, base_logits, rtol=0, atol=1e-6)  # adapters off: the base
    # No second copy of the base: the wrapped model's storages are the base's plus the adapters'.
    after = {p.untyped_storage().data_ptr() for p in base.parameters()}
    adapters = {t.untyped_storage().data_ptr() for _, t in adapter_tensors(base)}
    assert after - adapters == storages


def _sync(send, receive) -> None:
    """One broadcast over a real two-member gloo sync group (threads of this process)."""
    port, errors = free_port(), []

    def member(rank, job):
        try:
            job(WeightSyncGroup.create("127.0.0.1", port, rank, 2, "gloo", timeout_s=60))
        except Exception as exc:   # surfaced below: a thread's exception would vanish
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(1, receive)), threading.Thread(target=member, args=(0, send))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("train_audio_adapter", [False, True])
def test_a_rollout_copy_follows_the_policy_from_its_adapters_alone(base, tiny_model, batch, train_audio_adapter):
    cfg = lora_cfg(train_audio_adapter=train_audio_adapter)
    apply_lora(base, cfg)
    rollout = copy.deepcopy(tiny_model)
    apply_lora(rollout, cfg)
    train_step(base, batch)
    sent = adapter_tensors(base)
    assert sum(t.numel() for _, t in sent) < 0.2 * sum(p.numel() for p in tiny_model.parameters())
    _sync(lambda g: broadcast_tensors(sent, 0, g), lambda g: g.receive_into(adapter_tensors(rollout)))
    torch.testing.assert_close(logits(rollout, batch), logits(base, batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize("train_audio_adapter", [False, True])
def test_merged_weights_make_a_plain_copy_the_policy(base, tiny_model, batch, train_audio_adapter):
    apply_lora(base, lora_cfg(train_audio_adapter=train_audio_adapter))
    train_step(base, batch)
    plain = copy.deepcopy(tiny_model)
    named, read = merged_tensors(base, model_tensors(base))
    # The plain model's layout: a receiver that knows nothing of LoRA (vLLM) takes it as is.
    assert [(n, t.shape) for n, t in named] == [(n, t.shape) for n, t in model_tensors(plain)]
    _sync(lambda g: broadcast_tensors(named, 0, g, read), lambda g: g.receive_model(plain))
    torch.testing.assert_close(logits(plain, batch), logits(base, batch), rtol=0, atol=1e-5)
    assert (logits(plain, batch) - logits(tiny_model, batch)).abs().max() > 1e-2


def test_the_checkpoint_is_a_merged_export_plus_the_adapter(base, tiny_processor, batch, tmp_path):
    from peft import PeftModel

    base_dir = save_model_checkpoint(base, tiny_processor, tmp_path / "base")
    peft_model = apply_lora(base, lora_cfg(train_audio_adapter=True))
    train_step(base, batch)
    path = save_model_checkpoint(base, tiny_processor, tmp_path / "lora", {"stage": "sft"}, peft_model=peft_model)
    merged, _ = load_model(str(path))   # plain from_pretrained: no PEFT involved
    assert not lora_modules(merged)
    torch.testing.assert_close(logits(merged, batch), logits(base, batch), rtol=0, atol=1e-5)
    # The adapter alone, put back on the base by PEFT itself.
    start, _ = load_model(str(base_dir))
    restored = PeftModel.from_pretrained(start, str(path / ADAPTER_DIR)).get_base_model()
    torch.testing.assert_close(logits(restored, batch), logits(base, batch), rtol=0, atol=1e-6)
