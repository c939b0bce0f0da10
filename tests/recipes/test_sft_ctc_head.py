"""The SFT's optional CTC warm-up (`sft.ctc_warmup_steps`): only the audio path and the
CTC head (models/ctc.py) train."""
from __future__ import annotations

import torch


def test_ctc_warmup_trains_only_the_audio_path(root):
    """`sft.ctc_warmup_steps`: those first steps move encoder, adapter and CTC head and
    leave the LM as built (that the LM trains after them: test_sft_training). A run that
    ends inside its warm-up (here max_steps, as sft.max_minutes would) saves nothing: it
    ends in a ConfigError saying the LM never trained."""
    import pytest
    from helpers import compose_cfg, metric_history

    from asr_grpo.config.errors import ConfigError
    from asr_grpo.recipes.sft import SFTRecipe
    from asr_grpo.tracking import MlflowRun

    def snapshot(module):
        return {k: v.clone() for k, v in module.state_dict().items()}

    def changed(before, module):
        return [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]

    recipe = SFTRecipe(compose_cfg(root, "sft.ctc_warmup_steps=2", "sft.max_steps=2",
                                   "sft.eval_every_steps=0"))
    recipe.setup()
    inner = recipe.model.model
    lm, enc = snapshot(inner.language_model), snapshot(inner.audio_tower)
    adapter = snapshot(inner.multi_modal_projector)
    with pytest.raises(ConfigError, match="language model never trained and no checkpoint was saved"):
        with MlflowRun(recipe.cfg.logger, run_name="ctc-warmup", config=recipe.cfg) as tracker:
            run_id = tracker.run_id
            recipe.train(tracker)
    assert changed(lm, inner.language_model) == []
    assert changed(enc, inner.audio_tower) and len(changed(adapter, inner.multi_modal_projector)) == 4
    assert [s for s, _ in metric_history(recipe.cfg, run_id, "loss/ctc")] == [1, 2]
    assert metric_history(recipe.cfg, run_id, "loss/lm") == []
