"""A short SFT run on the debug corpus learns: the CTC loss falls during the CTC
warm-up and the LM loss falls in the steps after it."""
from __future__ import annotations

import statistics

from helpers import compose_cfg, metric_history, train_sft_logged


def test_short_sft_run_lowers_ctc_then_lm_loss(root):
    from asr_grpo.recipes.sft import SFTRecipe

    recipe = SFTRecipe(compose_cfg(root, "sft.ctc_warmup_steps=15", "sft.max_steps=40", "sft.eval_every_steps=0"))
    recipe.setup()
    run_id = train_sft_logged(recipe, "sft-short")
    ctc = [v for _, v in metric_history(recipe.cfg, run_id, "loss/ctc")]
    lm = [v for _, v in metric_history(recipe.cfg, run_id, "loss/lm")]
    assert len(ctc) == 15 and len(lm) == 25
    assert statistics.mean(ctc[-3:]) < 0.7 * statistics.mean(ctc[:3]), ctc
    assert statistics.mean(lm[-5:]) < 0.9 * statistics.mean(lm[:5]), lm
