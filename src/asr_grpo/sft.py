"""`python -m asr_grpo.sft`: build the corpus if needed, SFT the tiny model, print dev CER."""
from __future__ import annotations

import json
import logging

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.errors import one_line_errors
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import validate_config
from asr_grpo.recipes.sft_start import names_trained_weights

log = logging.getLogger(__name__)
register_configs()


def with_fitting_profile(cfg: DictConfig) -> DictConfig:
    """A trained `model.path` with the SFT profile left at its default (from scratch):
    the config composed again with `sft=finetune`, the user's overrides on top. SFT's own
    output folder holding a trained checkpoint counts as such a start (not as a folder to
    build again over it). A profile named on the command line stays (the recipe refuses
    one that does not fit)."""
    overrides = list(HydraConfig.get().overrides.task)
    named = any(o.split("=", 1)[0].lstrip("+~") == "sft" for o in overrides)
    if named or not names_trained_weights(cfg):
        return cfg
    if str(cfg.sft.profile) != "scratch":   # an experiment chose one
        return cfg
    log.info("model.path=%s is a trained checkpoint: SFT uses the fine-tuning profile (sft=finetune)",
             cfg.model.path)
    return compose(config_name="sft", overrides=[*overrides, "sft=finetune"])


def summary_line(dev: dict) -> str:
    """`dev CER 0.231 (de 0.210, fr 0.250)`: overall, then each language the data holds."""
    languages = [f"{k.split('/', 1)[1]} {v:.3f}" for k, v in dev.items() if k.startswith("cer/")]
    return f"dev CER {dev['cer']:.3f}" + (f" ({', '.join(languages)})" if languages else "")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="sft")
def main(cfg: DictConfig) -> None:
    with one_line_errors("asr_grpo.sft"):   # a bad key, manifest or model folder: say what
        cfg = with_fitting_profile(cfg)
        validate_config(cfg)
        from asr_grpo.recipes.sft import run_sft  # heavy imports after config validation

        summary = run_sft(cfg)
    dev, before = summary["dev"], summary.get("dev_before")
    print(json.dumps(summary, indent=2, default=str))
    if before:   # a fine-tune: where it started
        print(f"before fine-tuning: {summary_line(before)}")
    print(f"{summary_line(dev)} | checkpoint {summary['checkpoint']}")
    if "heldout_voices/cer" in dev:   # speakers no training split has
        print(f"held-out-voice CER {dev['heldout_voices/cer']:.3f}")
    conditions = {k.split("/")[1]: v for k, v in dev.items()
                  if k.startswith("heldout_conditions/") and k.endswith("/cer") and k.count("/") == 2}
    if conditions:   # those speakers in rooms, on phone lines, in noise
        print("held-out-conditions CER " + ", ".join(f"{name} {cer:.3f}" for name, cer in conditions.items()))


if __name__ == "__main__":
    main()
