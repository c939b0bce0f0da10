"""Tiny Qwen3-ASR: tokenizer, prompt masking, save/load round trip, encoder freezing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import TINY_MODEL, noise_audio

from asr_grpo.config.schema import ModelConfig
from asr_grpo.models import (
    IGNORE_INDEX,
    build_model,
    encode_requests,
    encode_supervised,
    is_complete_checkpoint,
    load_model,
    parameter_counts,
    save_hf_checkpoint,
    set_audio_encoder_frozen,
)
from asr_grpo.models.tokenizer import ASR_TEXT, IM_END


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer


@pytest.fixture(scope="module")
def processor(tiny_processor):
    return tiny_processor


@pytest.mark.parametrize("text", ["turn on the lights in the kitchen", "请打开客厅的灯", "call 张伟 now",
                                  "words never seen zebra", "没见过的字"])
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_each_chinese_character_is_its_own_token(tokenizer):
    text = "明天上午九点去北京"
    pieces = [tokenizer.decode([i]) for i in tokenizer(text)["input_ids"]]
    assert pieces == list(text)


def test_special_tokens_are_single_ids(tokenizer):
    audio = [tokenizer.audio_token, tokenizer.audio_bos_token, tokenizer.audio_eos_token]
    for tok in [ASR_TEXT, IM_END, *audio]:
        ids = tokenizer(tok, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == tok


def test_supervised_labels_cover_only_transcript_and_eos(processor, tokenizer):
    audios = [noise_audio(1.0, 0), noise_audio(2.3, 1)]
    targets = ["call alice", "请打开客厅的灯"]
    batch = encode_supervised(processor, audios, ["en", "zh"], targets)
    for row, target in zip(batch["labels"], targets):
        kept = row[row != IGNORE_INDEX].tolist()
        assert kept[-1] == tokenizer.convert_tokens_to_ids(IM_END)
        assert tokenizer.decode(kept[:-1]) == target
    # The number of audio placeholders follows the audio length (13 frames per second).
    n_audio = (batch["input_ids"] == processor.audio_token_id).sum(dim=1).tolist()
    assert n_audio[1] > n_audio[0] >= 13


def test_default_tiny_model_is_under_ten_million_parameters(tokenizer):
    counts = parameter_counts(build_model(ModelConfig(), tokenizer))
    assert 1_000_000 < counts.total < 10_000_000


def test_save_load_round_trip_gives_identical_logits(tmp_path, processor, tokenizer):
    model = build_model(TINY_MODEL, tokenizer, seed=3).eval()
    batch = encode_supervised(processor, [noise_audio(1.5, 2)], ["en"], ["send the report"])
    path = save_hf_checkpoint(model, processor, tmp_path / "ckpt", {"step": 7})
    assert is_complete_checkpoint(path)
    loaded, loaded_proc = load_model(str(path))
    with torch.no_grad():
        a = model(**batch).logits
        b = loaded.eval()(**batch).logits
    assert torch.equal(a, b)
    assert loaded_proc.tokenizer("请打开")["input_ids"] == tokenizer("请打开")["input_ids"]
    # Generation works on the reloaded pair through the same request path.
    req = encode_requests(loaded_proc, [noise_audio(1.0, 4)], ["zh"])
    out = loaded.generate(**req, max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= req["input_ids"].shape[1] + 3


def test_freeze_switch_keeps_encoder_fixed_and_trains_the_rest(processor, tokenizer):
    model = build_model(TINY_MODEL, tokenizer, seed=0)
    counts = set_audio_encoder_frozen(model, True)
    assert counts.frozen == counts.audio_encoder > 0
    assert counts.trainable == counts.total - counts.audio_encoder
    enc_before = {k: v.clone() for k, v in model.model.audio_tower.state_dict().items()}
    lm_before = model.model.language_model.layers[0].mlp.up_proj.weight.clone()
    adapter_before = model.model.multi_modal_projector.linear_1.weight.clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = encode_supervised(processor, [noise_audio(1.2, 5)], ["en"], ["call alice"])
    model(**batch).loss.backward()
    opt.step()
    for k, v in model.model.audio_tower.state_dict().items():
        assert torch.equal(v, enc_before[k]), k
    assert not torch.equal(model.model.language_model.layers[0].mlp.up_proj.weight, lm_before)
    assert not torch.equal(model.model.multi_modal_projector.linear_1.weight, adapter_before)
    unfrozen = set_audio_encoder_frozen(model, False)
    assert unfrozen.frozen == 0


def test_fresh_encoder_frames_carry_the_audio(processor, tokenizer):
    """From-scratch init keeps the mel signal above the encoder's positional embedding:
    with HF's N(0, 0.02) conv init every frame looked alike (cosine ~0.9997)."""
    model = build_model(ModelConfig(), tokenizer, seed=0).eval()
    t = np.linspace(0, 2, 32000, dtype=np.float32)
    chirp = (0.5 * np.sin(2 * np.pi * (200 + 900 * t) * t)).astype(np.float32)
    feats = processor.feature_extractor([chirp], sampling_rate=16000, return_attention_mask=True,
                                        padding=True, return_tensors="pt")
    with torch.no_grad():
        frames = model.model.audio_tower(input_features=feats["input_features"],
                                         input_features_mask=feats["attention_mask"]).last_hidden_state
    unit = torch.nn.functional.normalize(frames, dim=-1)
    assert float((unit @ unit.T).mean()) < 0.9


def test_fresh_adapter_hands_the_lm_unit_scale_audio_frames(processor, tokenizer):
    """The adapter's output is what the LM (and an SFT CTC head) reads: with HF's N(0, 0.02)
    init it came out at RMS ~0.04, and readers took hundreds of steps to hear it."""
    model = build_model(ModelConfig(), tokenizer, seed=0).eval()
    noise = np.random.default_rng(0).normal(0, 0.1, 32000).astype(np.float32)
    feats = processor.feature_extractor([noise], sampling_rate=16000, return_attention_mask=True,
                                        padding=True, return_tensors="pt")
    with torch.no_grad():
        frames = model.get_audio_features(feats["input_features"], feats["attention_mask"],
                                          return_dict=True).pooler_output
    rms = float(frames.pow(2).mean().sqrt())
    assert 0.3 < rms < 3.0, rms


def test_encoder_attention_window_limits_what_a_frame_attends_to(tokenizer):
    """`model.encoder_attention_window_s` is Qwen3-ASR's n_window_infer: with 1 s windows,
    the frames of the first second do not change when the audio after it changes."""
    import dataclasses

    x = torch.randn(1, 128, 300)
    later = x.clone()
    later[:, :, 100:] = torch.randn(1, 128, 200)
    mask = torch.ones(1, 300, dtype=torch.long)
    first_second = {}
    for window in (1, 8):
        model = build_model(dataclasses.replace(TINY_MODEL, encoder_attention_window_s=window), tokenizer,
                            seed=0)
        assert model.config.audio_config.n_window_infer == 100 * window
        enc = model.model.audio_tower.eval()
        with torch.no_grad():
            a, b = (enc(f, mask).last_hidden_state[:13] for f in (x, later))   # 13 frames per 1 s chunk
        first_second[window] = torch.equal(a, b)
    assert first_second == {1: True, 8: False}
