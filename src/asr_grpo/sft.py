"""`python -m asr_grpo.sft`: build the corpus if needed, SFT the tiny model, print dev CER."""
from __future__ import annotations

import json
import logging

import hydra
from omegaconf import DictConfig

from asr_grpo.config import register_configs
from asr_grpo.config.errors import one_line_errors
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import validate_config

log = logging.getLogger(__name__)
register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="sft")
def main(cfg: DictConfig) -> None:
    with one_line_errors("asr_grpo.sft"):   # a bad key, manifest or model folder: say what
        validate_config(cfg)
        from asr_grpo.recipes.sft import run_sft  # heavy imports after config validation

        summary = run_sft(cfg)
    dev = summary["dev"]
    print(json.dumps(summary, indent=2, default=str))
    print(f"dev CER {dev['cer']:.3f} (en {dev.get('cer/en', float('nan')):.3f}, "
          f"zh {dev.get('cer/zh', float('nan')):.3f}) | checkpoint {summary['checkpoint']}")
    if "heldout_voices/cer" in dev:   # speakers no training split has
        print(f"held-out-voice CER {dev['heldout_voices/cer']:.3f}")


if __name__ == "__main__":
    main()
