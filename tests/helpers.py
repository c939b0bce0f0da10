"""Small helpers shared by tests (importable: `tests/` is on pytest's pythonpath)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from asr_grpo.config.schema import ModelConfig

TINY_TEXTS = ["turn on the lights in the kitchen", "call alice at five thirty", "send the report to bob",
              "请打开客厅的灯", "明天上午九点去北京", "给张伟打电话"] * 10
TINY_MODEL = ModelConfig(encoder_layers=1, encoder_d_model=64, encoder_heads=2, encoder_ffn_dim=128,
                         encoder_downsample_hidden=16, text_layers=2, text_hidden=64, text_heads=2,
                         text_kv_heads=1, text_intermediate=128)


def noise_audio(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)


def compose_cfg(root, *overrides):
    """The run config on the seconds-long `debug=fast` setting, writing under `root`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=["debug=fast", f"paths.output_root={root}", *overrides])


def metric_history(cfg, run_id, key):
    """[(step, value)] of one metric of one MLflow run."""
    import mlflow

    from asr_grpo.tracking import absolute_tracking_uri

    client = mlflow.tracking.MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def train_sft_logged(recipe, run_name):
    """Run `recipe.train` (set up already) inside a real MLflow run; returns the run id."""
    from asr_grpo.tracking import MlflowRun

    with MlflowRun(recipe.cfg.logger, run_name=run_name, config=recipe.cfg) as tracker:
        recipe.train(tracker)
        return tracker.run_id


BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_bench_script(name: str):
    """bench/<name>.py as a module (bench/ is scripts, not a package); bench/ goes on
    sys.path too, for scripts that import their neighbours."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_policy_items(model, processor, tokenizer, advantages: list[float]):
    """Two sampled responses to one noise prompt (3 and 2 tokens, EOS included) as training
    items whose old, behaviour and reference log-probs are the model's own; each response's
    tokens carry its advantage. Returns the items and the log-probs ([2, T])."""
    import torch

    from asr_grpo.experience.types import ExperienceItem
    from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logprobs

    prompt, feats = encode_prompt(processor, noise_audio(1.0, 0), "en")
    words = tokenizer("call alice")["input_ids"]
    responses = [words[:2] + [tokenizer.eos_token_id], words[:1] + [tokenizer.eos_token_id]]
    batch = pack_sequences([prompt, prompt], responses, [feats, feats], tokenizer.pad_token_id)
    with torch.no_grad():
        logp = response_logprobs(model, batch)
    items = [ExperienceItem(uid=f"x#{i}", group="x", prompt_ids=prompt, response_ids=r, features=feats,
                            advantages=torch.full((len(r),), advantages[i]), old_logprobs=logp[i, :len(r)],
                            behaviour_logprobs=logp[i, :len(r)], ref_logprobs=logp[i, :len(r)])
             for i, r in enumerate(responses)]
    return items, logp


def call_main(command: str, argv: list[str], monkeypatch) -> None:
    """`python -m <command> <argv>` in this process: its Hydra `main` reading that argv
    (Hydra told to configure no logging: the test process keeps its own)."""
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.setattr(sys, "argv", [command, *argv, "hydra/job_logging=none", "hydra/hydra_logging=none"])
    GlobalHydra.instance().clear()
    try:
        importlib.import_module(command).main()
    finally:
        GlobalHydra.instance().clear()
