"""What may serve as a model to start from: any folder `from_pretrained` reads, not only
this project's own saves."""
from __future__ import annotations

import json

import pytest

from asr_grpo.models import checkpoint_problem, load_model, save_hf_checkpoint
from asr_grpo.models.checkpoint import COMPLETE_MARKER


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory, tiny_model, tiny_processor):
    """A Qwen3-ASR saved the way transformers users save: no project files."""
    path = tmp_path_factory.mktemp("plain") / "qwen3-asr"
    tiny_model.save_pretrained(path)
    tiny_processor.save_pretrained(path)
    return path


def test_a_plain_save_pretrained_folder_qualifies_and_loads(plain_folder, tiny_model):
    assert not (plain_folder / COMPLETE_MARKER).exists()
    assert checkpoint_problem(plain_folder) is None
    model, processor = load_model(str(plain_folder))
    assert model.config.text_config.hidden_size == tiny_model.config.text_config.hidden_size
    assert processor.tokenizer.pad_token_id == tiny_model.config.pad_token_id


def test_our_own_saves_qualify(tmp_path, tiny_model, tiny_processor):
    path = save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "ours", {"step": 1})
    assert checkpoint_problem(path) is None


def test_what_does_not_qualify_says_why(tmp_path):
    assert checkpoint_problem(tmp_path / "absent") == f"{tmp_path / 'absent'} does not exist"
    assert "no path given" == checkpoint_problem("")
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in checkpoint_problem(tmp_path / "empty")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps({"model_type": "qwen3_asr"}))
    assert "has a config.json but no weights" in checkpoint_problem(tmp_path / "noweights")
    (tmp_path / "file.bin").write_bytes(b"x")
    assert "is a file" in checkpoint_problem(tmp_path / "file.bin")


def test_a_model_saved_without_its_processor_is_refused_naming_the_files(tmp_path, tiny_model, tiny_processor):
    """transformers would fail on it later with an OSError naming neither file."""
    path = tmp_path / "model-only"
    tiny_model.save_pretrained(path)
    problem = checkpoint_problem(path)
    assert problem.startswith(f"{path} has a model but no processor: ")
    assert "no tokenizer (tokenizer.json or vocab.json or tokenizer.model)" in problem
    assert "no feature extractor config (preprocessor_config.json or processor_config.json)" in problem
    tiny_processor.tokenizer.save_pretrained(path)   # the tokenizer alone: the feature extractor is still named
    assert "no tokenizer" not in checkpoint_problem(path) and "no feature extractor config" in checkpoint_problem(path)
    tiny_processor.save_pretrained(path)
    assert checkpoint_problem(path) is None


def test_a_hub_id_is_left_to_from_pretrained():
    assert checkpoint_problem("Qwen/Qwen3-ASR-1.7B") is None
    assert checkpoint_problem("./Qwen/Qwen3-ASR-1.7B") is not None   # a relative path that is not there
