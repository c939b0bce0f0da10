"""The SFT's optional auxiliary CTC head: its loss is a real CTC loss over the frames
of each utterance (split by frame counts), and it can be learnt."""
from __future__ import annotations

import torch

from asr_grpo.models import IGNORE_INDEX
from asr_grpo.recipes.sft import CTCHead

EOS = 9


def _labels(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows) + 3
    out = torch.full((len(rows), width), IGNORE_INDEX)
    for i, r in enumerate(rows):
        out[i, 2:2 + len(r)] = torch.tensor(r)   # prompt positions stay ignored
        out[i, 2 + len(r)] = EOS                  # EOS is not a CTC target
    return out


def test_ctc_head_matches_per_utterance_ctc_and_learns():
    torch.manual_seed(0)
    head = CTCHead(frame_dim=8, vocab_size=10)
    frame_lens = torch.tensor([7, 5])
    frames = torch.randn(int(frame_lens.sum()), 8)
    labels = _labels([[1, 2, 3], [4, 4]])
    loss = head.loss(frames, frame_lens, labels, eos_id=EOS)

    # The same loss computed one utterance at a time, by hand.
    per_utt = []
    for chunk, target in zip(torch.split(frames, [7, 5]), ([1, 2, 3], [4, 4])):
        logp = torch.log_softmax(head.proj(chunk), dim=-1).unsqueeze(1)
        nll = torch.nn.functional.ctc_loss(logp, torch.tensor([target]), torch.tensor([len(chunk)]),
                                           torch.tensor([len(target)]), blank=10, reduction="sum")
        per_utt.append(nll / len(target))
    torch.testing.assert_close(loss, torch.stack(per_utt).mean())

    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        step_loss = head.loss(frames, frame_lens, labels, eos_id=EOS)
        step_loss.backward()
        opt.step()
    assert step_loss.item() < 0.3 * loss.item()


def test_ctc_warmup_trains_only_the_audio_path(root):
    """`sft.ctc_warmup_steps`: those first steps move encoder, adapter and CTC head and
    leave the LM as built (that the LM trains after them: test_sft_training)."""
    from helpers import compose_cfg, metric_history, train_sft_logged

    from asr_grpo.recipes.sft import SFTRecipe

    def snapshot(module):
        return {k: v.clone() for k, v in module.state_dict().items()}

    def changed(before, module):
        return [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]

    recipe = SFTRecipe(compose_cfg(root, "sft.ctc_warmup_steps=2", "sft.max_steps=2", "sft.eval_every_steps=0"))
    recipe.setup()
    inner = recipe.model.model
    lm, enc = snapshot(inner.language_model), snapshot(inner.audio_tower)
    adapter = snapshot(inner.multi_modal_projector)
    run_id = train_sft_logged(recipe, "ctc-warmup")
    assert changed(lm, inner.language_model) == []
    assert changed(enc, inner.audio_tower) and len(changed(adapter, inner.multi_modal_projector)) == 4
    assert [s for s, _ in metric_history(recipe.cfg, run_id, "loss/ctc")] == [1, 2]
    assert metric_history(recipe.cfg, run_id, "loss/lm") == []
