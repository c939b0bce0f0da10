"""SFT knows where it starts: from a trained checkpoint (a plain `save_pretrained` folder,
as a real Qwen3-ASR comes) `python -m asr_grpo.sft` picks the fine-tuning profile
(`sft=finetune`) and leaves the model reading at least as well as before; a profile that
does not fit the start, named by the user, is refused before anything is built."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import call_main, compose_cfg

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg


@pytest.fixture(scope="module")
def reading_start(root, tmp_path_factory):
    """A model that reads three short utterances (trained on them from scratch), saved
    the way `save_pretrained` leaves a foreign checkpoint (no marker of this project),
    with a manifest of those three utterances."""
    from asr_grpo.data import resolve_manifests
    from asr_grpo.models import load_model
    from asr_grpo.recipes.sft import run_sft

    folder = tmp_path_factory.mktemp("finetune")
    train = Path(resolve_manifests(compose_cfg(root).data, root).train)
    rows = sorted((json.loads(line) for line in train.read_text().splitlines()), key=lambda r: r["duration"])[:3]
    for r in rows:   # the manifest lives elsewhere: its audio paths absolute
        r["audio"] = str((train.parent / r["audio"]).resolve())
    manifest = folder / "three.jsonl"
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    data = [f"data.train_manifest={manifest}", f"data.dev_manifest={manifest}"]
    run_sft(compose_cfg(root, *data, f"sft.output_dir={folder / 'scratch'}", "sft.max_steps=60",
                        "sft.ctc_warmup_steps=10", "sft.warmup_steps=5", "sft.batch_size=3",
                        "sft.wave_augment.speed_prob=0", "sft.wave_augment.babble_prob=0", "sft.max_new_tokens=48"))
    model, processor = load_model(str(folder / "scratch"))
    plain = folder / "plain"
    model.save_pretrained(plain)
    processor.save_pretrained(plain)
    return plain, data


def dev_cer(line_start: str, out: str) -> float:
    return float(re.search(rf"^{line_start}dev CER ([0-9.]+)", out, re.M).group(1))


def test_a_trained_start_picks_the_finetune_profile_and_reads_no_worse(root, reading_start, tmp_path, monkeypatch,
                                                                        capsys):
    from asr_grpo.models import audio_encoder, load_model

    plain, data = reading_start
    out = tmp_path / "ft"
    call_main("asr_grpo.sft", ["debug=fast", f"paths.output_root={root}", f"model.path={plain}", *data,
                               f"sft.output_dir={out}", "sft.ctc_warmup_steps=0", "sft.max_steps=10",
                               "sft.max_new_tokens=48"], monkeypatch)
    printed = capsys.readouterr().out
    before, after = dev_cer("before fine-tuning: ", printed), dev_cer("", printed)
    assert before < 0.5, f"the start should read its three utterances: {printed}"
    assert after <= before, printed
    meta = json.loads((out / "checkpoint_complete.json").read_text())
    assert meta["steps"] == 10
    start, tuned = load_model(str(plain))[0], load_model(str(out))[0]
    frozen = audio_encoder(start).state_dict()   # the profile freezes the encoder ...
    assert all(torch.equal(v, frozen[k]) for k, v in audio_encoder(tuned).state_dict().items())
    lm = start.model.language_model.state_dict()   # ... and trains the LM
    assert any(not torch.equal(v, lm[k]) for k, v in tuned.model.language_model.state_dict().items())


def test_the_scratch_recipe_named_for_a_trained_start_is_refused_naming_both(root, reading_start, tmp_path,
                                                                            monkeypatch):
    plain, data = reading_start
    with pytest.raises(SystemExit) as exited:
        call_main("asr_grpo.sft", ["debug=fast", f"paths.output_root={tmp_path}", f"model.path={plain}", *data,
                                   "sft=default"], monkeypatch)
    message = exited.value.code
    assert f"model.path={plain} is a trained checkpoint, but sft=default is the recipe for fresh weights" in message
    assert "use sft=finetune" in message and not (tmp_path / "mlflow.db").exists()


def test_sfts_own_output_folder_named_as_the_start_is_fine_tuned_not_built_over(reading_start, tmp_path,
                                                                                  monkeypatch, capsys):
    import shutil

    plain, data = reading_start
    own = tmp_path / "checkpoints" / "sft-tiny"   # sft=default's output folder under this output root
    shutil.copytree(plain, own)
    weights = (own / "model.safetensors").read_bytes()
    call_main("asr_grpo.sft", [f"paths.output_root={tmp_path}", f"model.path={own}", *data, "sft.max_steps=2",
                               "sft.max_new_tokens=48"], monkeypatch)
    printed = capsys.readouterr().out
    assert "before fine-tuning: dev CER" in printed, printed   # a fine-tune, not a build from scratch
    assert json.loads((tmp_path / "checkpoints" / "sft-finetune" / "checkpoint_complete.json").read_text())["steps"] == 2
    assert (own / "model.safetensors").read_bytes() == weights


def test_a_fine_tune_that_would_write_over_its_start_is_refused(reading_start, tmp_path, monkeypatch):
    import shutil

    plain, data = reading_start
    own = tmp_path / "mine"
    shutil.copytree(plain, own)
    with pytest.raises(SystemExit) as exited:
        call_main("asr_grpo.sft", [f"paths.output_root={tmp_path}", f"model.path={own}", f"sft.output_dir={own}",
                                   *data, "sft.max_steps=2"], monkeypatch)
    assert f"model.path={own} is also sft.output_dir: the fine-tune would write over" in exited.value.code
    assert sorted(p.name for p in own.iterdir()) == sorted(p.name for p in plain.iterdir())


def test_the_finetune_profile_on_fresh_weights_is_refused(root):
    from asr_grpo.config.errors import ConfigError
    from asr_grpo.recipes.sft import SFTRecipe

    cfg = compose_cfg(root, "sft=finetune", "sft.ctc_warmup_steps=0", "model.path=")
    with pytest.raises(ConfigError, match="sft=finetune fine-tunes a trained checkpoint.*use sft=default"):
        SFTRecipe(cfg).setup()


@pytest.mark.parametrize("overrides, says", [
    (["sft.ctc_warmup_steps=500", "sft.max_steps=100"],
     "sft.ctc_warmup_steps=500 is not below sft.max_steps=100: the run would end inside its CTC warm-up"),
    (["sft=finetune", "sft.ctc_warmup_steps=5"], "sft.ctc_warmup_steps=5 with sft=finetune"),
])
def test_a_ctc_warmup_that_cannot_fit_is_refused_before_the_run(tmp_path, overrides, says):
    from asr_grpo.config.errors import ConfigError
    from asr_grpo.config.validate import validate_config

    with pytest.raises(ConfigError, match=re.escape(says)):
        validate_config(compose_cfg(tmp_path, *overrides))


def test_the_finetune_profile_differs_from_scratch_where_it_matters():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config.store import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        tune, scratch = (compose("sft", overrides=[f"sft={name}"]).sft for name in ("finetune", "default"))
    assert (str(tune.profile), str(scratch.profile)) == ("finetune", "scratch")
    assert tune.ctc_warmup_steps == 0 < scratch.ctc_warmup_steps
    assert tune.lr <= scratch.lr / 50 and not tune.train_audio_encoder and scratch.train_audio_encoder
    assert tune.wave_augment.speed_prob == tune.wave_augment.babble_prob == 0
    assert not any(tune.wave_augment.conditions.values())   # no rooms, lines or noise either
