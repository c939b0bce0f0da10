"""An auxiliary CTC head over the adapter's audio frames (hybrid CTC/attention training)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from asr_grpo.models.prompting import IGNORE_INDEX


class CTCHead(torch.nn.Module):
    """A linear layer maps each frame to the token vocabulary plus a blank, so the encoder
    gets a direct, alignment-free signal to carry what is said, instead of waiting for
    the decoder to discover the audio. SFT only: the checkpoint keeps just the Qwen3-ASR
    weights."""

    def __init__(self, frame_dim: int, vocab_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(frame_dim, vocab_size + 1)
        self.blank_id = vocab_size

    def loss(self, frames: torch.Tensor, frame_lens: torch.Tensor, labels: torch.Tensor,
             eos_id: int) -> torch.Tensor:
        # Targets: the transcript tokens (labels without the ignore index and the EOS).
        targets = [row[(row != IGNORE_INDEX) & (row != eos_id)] for row in labels]
        target_lens = torch.tensor([len(t) for t in targets])
        logp = F.log_softmax(self.proj(frames), dim=-1)
        # frames arrive flattened over the batch: split per utterance and pad to [T, B, V].
        per_utt = torch.split(logp, frame_lens.tolist())
        padded = torch.nn.utils.rnn.pad_sequence(per_utt)
        return F.ctc_loss(padded, torch.cat(targets), frame_lens, target_lens,
                          blank=self.blank_id, reduction="mean", zero_infinity=True)
