"""Runs never overwrite each other: a run checkpoints into its own Hydra run folder,
smoke and quick runs keep their own SFT checkpoint, old step checkpoints can be pruned,
`compare` registers only a checkpoint its run wrote, and `model.init=random` builds its
fresh weights once."""
from __future__ import annotations

import hashlib
import json

import mlflow
import pytest
from helpers import TINY_MODEL, TINY_TEXTS, compose_cfg
from hydra.core.hydra_config import HydraConfig

from asr_grpo.config.validate import ConfigError
from asr_grpo.models import build_model, build_processor, save_hf_checkpoint, train_tokenizer
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.recipes.sft import run_sft
from asr_grpo.recipes.start_checkpoint import fresh_weights_dir, prepare_start_checkpoint
from asr_grpo.run import own_checkpoint_folder
from asr_grpo.tracking.registry import log_best_checkpoint
from asr_grpo.tracking.selection import Selection


def as_hydra_run(cfg, run_dir, *overrides: str):
    """Make `cfg` look like the one `python -m asr_grpo.run` gets: HydraConfig set."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config.store import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        full = compose("config", overrides=list(overrides), return_hydra_config=True)   # hydra.* included
    full.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(full)
    return cfg


def test_each_run_checkpoints_into_its_own_run_folder(tmp_path):
    folders = []
    for run in ("a", "b"):
        cfg = as_hydra_run(compose_cfg(tmp_path), tmp_path / "runs" / run, "debug=fast")
        own_checkpoint_folder(cfg)
        folders.append(cfg.trainer.output_dir)
    assert folders == [str(tmp_path / "runs" / "a" / "checkpoints"), str(tmp_path / "runs" / "b" / "checkpoints")]


def test_an_output_dir_on_the_command_line_is_kept(tmp_path):
    cfg = as_hydra_run(compose_cfg(tmp_path, f"trainer.output_dir={tmp_path}/mine"), tmp_path / "runs" / "a",
                       f"trainer.output_dir={tmp_path}/mine")
    own_checkpoint_folder(cfg)
    assert cfg.trainer.output_dir == f"{tmp_path}/mine"


def test_resume_without_naming_the_run_says_which_runs_can_resume(tmp_path):
    done = tmp_path / "runs" / "2026-12-01" / "10-00-00" / "checkpoints"
    (done / "step_000004").mkdir(parents=True)
    cfg = as_hydra_run(compose_cfg(tmp_path, "trainer.resume=true"), tmp_path / "runs" / "new", "trainer.resume=true")
    with pytest.raises(ConfigError, match=f"trainer.output_dir=... \\(newest: {done}\\)"):
        own_checkpoint_folder(cfg)


def compose_plain(root, *overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config.store import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[f"paths.output_root={root}", *overrides])


def test_smoke_and_quick_runs_keep_their_own_sft_checkpoint(tmp_path):
    real = compose_plain(tmp_path).sft.output_dir
    assert real == f"{tmp_path}/checkpoints/sft-tiny"
    smoke = compose_plain(tmp_path, "debug=fast")
    quick = compose_plain(tmp_path, "experiment=sft_quick")
    assert len({real, smoke.sft.output_dir, quick.sft.output_dir}) == 3
    assert smoke.model.path == smoke.sft.output_dir   # RL of the smoke run starts from the smoke SFT


@pytest.mark.slow
def test_a_smoke_run_between_real_runs_leaves_the_real_sft_checkpoint_untouched(tmp_path):
    tokenizer = train_tokenizer(TINY_TEXTS, 300)
    real = save_hf_checkpoint(build_model(TINY_MODEL, tokenizer), build_processor(tokenizer),
                              tmp_path / "checkpoints" / "sft-tiny", {"stage": "sft"})
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in real.iterdir()}
    summary = run_sft(compose_cfg(tmp_path, "model.path="))   # debug=fast's SFT
    assert summary["checkpoint"] == f"{tmp_path}/checkpoints/sft-debug-fast"
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in real.iterdir()} == before


def test_keep_last_prunes_older_step_checkpoints_after_the_new_one_is_in(tmp_path):
    for step in range(1, 5):
        staging = ckpt.staging_dir(tmp_path, step)
        (staging / "weights").write_text(str(step))
        ckpt.commit(tmp_path, staging, step, {"step": step}, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000003", "step_000004"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000004"


def test_compare_registers_only_a_checkpoint_its_run_wrote(tmp_path, tiny_model, tiny_processor):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = mlflow.tracking.MlflowClient()
    exp = client.create_experiment("e")
    mine, other = (client.create_run(exp).info.run_id for _ in range(2))
    out = tmp_path / "rl"
    staging = ckpt.staging_dir(out, 2)
    save_hf_checkpoint(tiny_model, tiny_processor, staging / "hf")
    ckpt.commit(out, staging, 2, {"step": 2, "mlflow_run_id": other})   # a later run reused the folder
    best = {"run_id": mine, "params": {"trainer.output_dir": str(out)}, "metrics": {"final_cer": 0.2},
            "label": "oppo", "seed": "0"}
    result = log_best_checkpoint(client, best, "m", Selection("x", "x", [], exp))
    assert result == {"run_id": mine, "logged": False,
                      "reason": f"the checkpoint in {out} belongs to MLflow run {other}, not {mine}"}
    best["run_id"] = other
    assert log_best_checkpoint(client, best, "m", Selection("x", "x", [], exp))["logged"] is True


SCALED_0P6B = ("model=qwen3_asr_0p6b", "model.init=random", "model.dtype=float32", "model.encoder_layers=1",
               "model.encoder_d_model=64", "model.encoder_heads=4", "model.encoder_ffn_dim=128",
               "model.encoder_downsample_hidden=16", "model.text_layers=1", "model.text_hidden=64",
               "model.text_heads=4", "model.text_kv_heads=2", "model.text_head_dim=16",
               "model.text_intermediate=128", "model.vocab_size=1024", "model.max_position_embeddings=2048")


def test_random_init_builds_fresh_weights_once_and_skips_sft(tmp_path):
    cfg = compose_cfg(tmp_path, *SCALED_0P6B)
    path = prepare_start_checkpoint(cfg)
    assert path == str(fresh_weights_dir(cfg)) and not (tmp_path / "checkpoints" / "sft-debug-fast").exists()
    config = json.loads((fresh_weights_dir(cfg) / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == 1024 and config["text_config"]["head_dim"] == 16
    stamp = (fresh_weights_dir(cfg) / "model.safetensors").stat().st_mtime_ns
    assert prepare_start_checkpoint(cfg) == path   # reused, not rebuilt
    assert (fresh_weights_dir(cfg) / "model.safetensors").stat().st_mtime_ns == stamp
    assert fresh_weights_dir(compose_cfg(tmp_path, *SCALED_0P6B, "model.text_layers=2")) != fresh_weights_dir(cfg)


def test_a_model_path_that_cannot_load_fails_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=f"model.path='{tmp_path}/nothing': .* does not exist"):
        prepare_start_checkpoint(compose_cfg(tmp_path, f"model.path={tmp_path}/nothing"))


def test_sft_records_its_training_manifest_and_rl_checks_it(root, tmp_path):
    from asr_grpo.data import resolve_manifests
    from asr_grpo.data.manifest import manifest_digest
    from asr_grpo.models import checkpoint_metadata
    from asr_grpo.recipes.start_checkpoint import other_training_data_problem

    cfg = compose_cfg(root)
    meta = checkpoint_metadata(cfg.model.path)
    train = resolve_manifests(cfg.data, root).train
    assert meta["train_manifest_sha256"] == manifest_digest(train)
    assert other_training_data_problem(cfg, meta) is None
    # Another corpus (one more training utterance): named, with both digests.
    other = compose_cfg(root, "data.corpus.num_train=25")
    other_train = resolve_manifests(other.data, root).train
    problem = other_training_data_problem(other, meta)
    assert f"was not trained on {other_train}" in problem
    digests = meta["train_manifest_sha256"][:12], manifest_digest(other_train)[:12]
    assert "its digest {}, the manifest's {}".format(*digests) in problem
    assert "was not recorded" in other_training_data_problem(cfg, {"stage": "sft"})   # an older checkpoint
    # A corpus change that leaves train alone (more RL prompts) is no problem.
    assert other_training_data_problem(compose_cfg(root, "data.corpus.num_rl=9"), meta) is None
