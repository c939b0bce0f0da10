"""trainer.gradient_checkpointing: the policy's and the critic's training losses and
gradients are the same (up to float rounding) with activations recomputed in the
backward pass as with activations kept, and the recompute really happens."""
from __future__ import annotations

import copy

import pytest
import torch
from helpers import noise_audio

from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.distributed.deepspeed_strategy import enable_gradient_checkpointing
from asr_grpo.experience.losses import actor_loss, critic_loss
from asr_grpo.experience.types import ExperienceItem
from asr_grpo.models import set_audio_encoder_frozen
from asr_grpo.models.critic import ValueModel
from asr_grpo.models.sequences import encode_prompt


@pytest.fixture(scope="module")
def items(tiny_processor, tiny_tokenizer):
    """Off-policy experience (old log-probs away from the model's) so every term has a gradient."""
    g = torch.Generator().manual_seed(5)
    words = tiny_tokenizer("call alice at five thirty")["input_ids"]
    out = []
    for j, (secs, lang) in enumerate([(1.0, "en"), (1.8, "zh")]):
        prompt, feats = encode_prompt(tiny_processor, noise_audio(secs, j), lang)
        for k, n in enumerate([4, 2]):
            r = words[:n] + [tiny_tokenizer.eos_token_id]
            rand = [torch.randn(len(r), generator=g) for _ in range(5)]
            out.append(ExperienceItem(uid=f"u{j}#{k}", group=f"u{j}", prompt_ids=prompt, response_ids=r,
                                      features=feats, advantages=rand[0], old_logprobs=-3.0 + 0.1 * rand[1],
                                      behaviour_logprobs=-3.0 + 0.1 * rand[1], ref_logprobs=-3.0 + 0.1 * rand[2],
                                      returns=rand[3], old_values=0.1 * rand[4]))
    return out


def loss_and_grads(model, loss_fn, checkpointing: bool):
    model = copy.deepcopy(model).train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    layer = model.backbone if isinstance(model, ValueModel) else model.model
    calls = []
    # A module inside the checkpointed layer (the layer's own hooks stay outside the
    # checkpoint; its last ones may not rerun: the recompute stops once it has what it needs).
    hook = layer.language_model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))
    loss, _ = loss_fn(model)
    forward_calls = len(calls)
    loss.backward()
    hook.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    return loss.item(), grads, len(calls) - forward_calls


def assert_same(model, loss_fn):
    loss, grads, recomputed = loss_and_grads(model, loss_fn, checkpointing=False)
    loss_ckpt, grads_ckpt, recomputed_ckpt = loss_and_grads(model, loss_fn, checkpointing=True)
    assert (recomputed, recomputed_ckpt) == (0, 1)   # the layer ran again in the backward pass
    assert loss_ckpt == pytest.approx(loss, rel=1e-6, abs=1e-7)
    assert grads.keys() == grads_ckpt.keys()
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_policy_loss_and_gradients_are_unchanged(tiny_model, tiny_tokenizer, items):
    model = copy.deepcopy(tiny_model)
    set_audio_encoder_frozen(model, True)
    algo = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01, temperature=0.8)
    assert_same(model, lambda m: actor_loss(m, items, algo, tiny_tokenizer.pad_token_id))


def test_critic_loss_and_gradients_are_unchanged(tiny_model, tiny_tokenizer, items):
    policy = copy.deepcopy(tiny_model)
    set_audio_encoder_frozen(policy, True)
    critic = ValueModel(policy.model, policy.config.text_config.hidden_size)
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)
    algo = AlgorithmConfig(value_clip=0.2)
    assert_same(critic, lambda m: critic_loss(m, items, algo, tiny_tokenizer.pad_token_id))


def test_a_model_without_checkpointing_support_is_refused():
    with pytest.raises(TypeError, match="trainer.gradient_checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
