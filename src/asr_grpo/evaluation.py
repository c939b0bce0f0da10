"""Greedy transcription and held-out error rates (shared by SFT and RL evaluation)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from asr_grpo.models import decode_responses, encode_requests
from asr_grpo.models.sequences import on_model_device
from asr_grpo.rewards.text import error_rates_by_language


@torch.no_grad()
def transcribe(model, processor, audios: Sequence[np.ndarray], languages: Sequence[str],
               batch_size: int = 32, max_new_tokens: int = 96, progress: str | None = None) -> list[str]:
    """Greedy decoding, batched by similar length (order of the result = order of input).
    `progress`: a progress bar with this label (off inside Ray workers, whose stderr is a log)."""
    was_training = model.training
    model.eval()
    order = np.argsort([len(a) for a in audios], kind="stable")
    out: list[str] = [""] * len(audios)
    for start in tqdm(range(0, len(order), batch_size), desc=progress, disable=progress is None,
                      unit="batch", leave=False, dynamic_ncols=True):
        idx = order[start:start + batch_size]
        batch = encode_requests(processor, [audios[i] for i in idx], [languages[i] for i in idx])
        generated = model.generate(**on_model_device(model, dict(batch)), max_new_tokens=max_new_tokens,
                                   do_sample=False).cpu()
        texts = decode_responses(processor, generated[:, batch["input_ids"].shape[1]:])
        for i, text in zip(idx, texts):
            out[i] = text.strip()
    model.train(was_training)
    return out


def evaluate_dataset(model, processor, dataset, max_utterances: int | None = None,
                     batch_size: int = 32, max_new_tokens: int = 96) -> tuple[dict[str, float], list[dict]]:
    """CER/WER overall and per language on the first `max_utterances` of `dataset`."""
    n = len(dataset) if not max_utterances else min(len(dataset), max_utterances)
    load = getattr(dataset, "load", dataset.__getitem__)   # AsrDataset.load: the bad-audio policy
    items = [it for it in map(load, range(n)) if it is not None]
    hyps = transcribe(model, processor, [it["audio"] for it in items], [it["language"] for it in items],
                      batch_size=batch_size, max_new_tokens=max_new_tokens, progress="eval")
    refs = [it["text"] for it in items]
    langs = [it["language"] for it in items]
    rows = [{"id": it["id"], "language": it["language"], "ref": r, "hyp": h}
            for it, r, h in zip(items, refs, hyps)]
    return error_rates_by_language(hyps, refs, langs), rows
