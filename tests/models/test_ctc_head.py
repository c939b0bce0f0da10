"""The auxiliary CTC head: its loss is a real CTC loss over the frames of each utterance
(split by frame counts), and it can be learnt."""
from __future__ import annotations

import torch

from asr_grpo.models import IGNORE_INDEX
from asr_grpo.models.ctc import CTCHead

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
