"""Where SFT starts, and which SFT recipe fits the start: `sft=default` (profile `scratch`) trains fresh weights,
`sft=finetune` a trained checkpoint. The from-scratch recipe (a CTC warm-up through a
fresh CTC head, a learning rate of 1e-3 order, a trainable encoder, waveform
perturbation) would damage a trained model; the fine-tuning one cannot teach fresh
weights to listen."""
from __future__ import annotations

from pathlib import Path

from asr_grpo.config.errors import ConfigError


def is_sft_output(cfg) -> bool:
    """`model.path` names SFT's own output folder (the RL config's default)."""
    return bool(cfg.model.path) and Path(cfg.model.path).resolve() == Path(cfg.sft.output_dir).resolve()


def starts_from_checkpoint(cfg) -> bool:
    """SFT fine-tunes `model.path` when one is given, other than its own output folder
    (the RL config points `model.path` there: SFT then builds that checkpoint)."""
    return bool(cfg.model.path) and cfg.model.init == "pretrained" and not is_sft_output(cfg)


def check_model_path(cfg) -> None:
    """A `model.path` that cannot load is the user's to fix: a ConfigError naming it and why."""
    from asr_grpo.models import checkpoint_problem  # torch and transformers: only once needed

    problem = checkpoint_problem(cfg.model.path)
    if problem is not None:
        raise ConfigError(f"model.path={cfg.model.path!r}: {problem}")


def loads_trained_weights(cfg) -> bool:
    """`model.path` loads, and not as `model.init=random`'s fresh weights (a folder of this
    project's marks them; a foreign folder or hub id counts as trained). One that cannot
    load is `check_model_path`'s to report."""
    from asr_grpo.models import checkpoint_metadata, checkpoint_problem, is_complete_checkpoint

    if checkpoint_problem(cfg.model.path) is not None:
        return False
    path = Path(cfg.model.path)
    if path.is_dir() and is_complete_checkpoint(path):
        return checkpoint_metadata(path).get("init") != "random"
    return True


def names_trained_weights(cfg) -> bool:
    """`model.path` names trained weights, SFT's own output folder included (where a
    trained checkpoint there is one to fine-tune, not one to build again over it)."""
    return bool(cfg.model.path) and cfg.model.init == "pretrained" and loads_trained_weights(cfg)


def starts_trained(cfg) -> bool:
    """SFT starts from trained weights: a `model.path` other than its own output folder
    that loads trained weights."""
    return starts_from_checkpoint(cfg) and loads_trained_weights(cfg)


def holds_trained_output(cfg) -> bool:
    """`model.path` is SFT's own output folder and trained weights are already there.
    Named on SFT's command line that is a checkpoint to fine-tune: building it again
    from scratch would write fresh weights over it."""
    return is_sft_output(cfg) and names_trained_weights(cfg)


def profile_problem(cfg) -> str | None:
    """Why `cfg.sft`'s profile does not fit where SFT starts (None: it fits)."""
    sft, trained = cfg.sft, starts_trained(cfg)
    if str(sft.profile) == "finetune" and holds_trained_output(cfg):
        return (f"model.path={cfg.model.path} is also sft.output_dir: the fine-tune would write over the "
                f"checkpoint it starts from; give sft.output_dir=<another folder>")
    if trained and str(sft.profile) == "scratch":
        return (f"model.path={cfg.model.path} is a trained checkpoint, but sft=default is the recipe for fresh "
                f"weights ({sft.ctc_warmup_steps}-step CTC warm-up through a fresh CTC head, lr {sft.lr:g}, "
                f"trainable audio encoder, waveform perturbation), which would damage it: use sft=finetune "
                f"(the fine-tuning profile: no CTC warm-up, low lr, frozen encoder, no perturbation)")
    if not trained and str(sft.profile) == "finetune":
        return ("sft=finetune fine-tunes a trained checkpoint, but this SFT starts from fresh weights (no "
                "model.path, its own output folder, or model.init=random): use sft=default, the recipe for "
                "fresh weights (or name a trained checkpoint with model.path=...)")
    return None


def check_lora_start(cfg) -> None:
    """LoRA adapts a trained model: SFT with `model.lora.rank` > 0 needs weights to start
    from, and no CTC warm-up (it trains the audio side and a CTC head, not the adapters)."""
    from asr_grpo.models.lora import lora_enabled

    lora = cfg.model.lora
    if not lora_enabled(lora):
        return
    if not starts_from_checkpoint(cfg) and cfg.model.init != "random":
        raise ConfigError(f"model.lora.rank={lora.rank}: LoRA fine-tunes a trained model, and SFT has none to "
                          "start from: give model.path=<checkpoint> (or model.lora.rank=0 to train from scratch; "
                          "model.init=random for a systems benchmark)")
    if cfg.sft.ctc_warmup_steps > 0:
        raise ConfigError(f"model.lora.rank={lora.rank} with sft.ctc_warmup_steps={cfg.sft.ctc_warmup_steps}: the "
                          "CTC warm-up trains the audio side from scratch, which LoRA keeps frozen; set "
                          "sft.ctc_warmup_steps=0")
