"""Greedy transcription and held-out error rates (shared by SFT and RL evaluation).

The evaluation sets are dev and, when there is one, the held-out-voice split (speakers
no training split has) and that split under each held-out acoustic condition. Their
metrics share one dict, dev's keys as they always were (`cer`, `cer/en`, ...), the others
under their set's name, so that logged with the recipes' `eval/` prefix they read
`eval/heldout_voices/cer/en` or `eval/heldout_conditions/phone/cer`."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from asr_grpo.data import AsrDataset, CorpusManifests
from asr_grpo.data.conditions import SPLIT as CONDITIONS_SPLIT
from asr_grpo.data.conditions import heldout_condition_manifests
from asr_grpo.data.corpus import HELDOUT_SPLIT
from asr_grpo.data.dataset import load_first
from asr_grpo.models import decode_responses, encode_requests
from asr_grpo.models.sequences import on_model_device
from asr_grpo.rewards.text import error_rates_by_language


@torch.no_grad()
def decode_batched(model, processor, audios: Sequence[np.ndarray], languages: Sequence[str],
                   batch_size: int = 32, max_new_tokens: int = 96, progress: str | None = None,
                   num_return_sequences: int = 1, **generate_kwargs) -> list[list[str]]:
    """`num_return_sequences` transcripts per utterance from `model.generate` (greedy unless
    `generate_kwargs` ask to sample), batched by similar length; the result keeps the input's
    order. `progress`: a progress bar with this label (off inside Ray workers, whose stderr is a log)."""
    was_training = model.training
    model.eval()
    order = np.argsort([len(a) for a in audios], kind="stable")
    out: list[list[str]] = [[] for _ in audios]
    n = num_return_sequences
    for start in tqdm(range(0, len(order), batch_size), desc=progress, disable=progress is None,
                      unit="batch", leave=False, dynamic_ncols=True):
        idx = order[start:start + batch_size]
        batch = encode_requests(processor, [audios[i] for i in idx], [languages[i] for i in idx])
        generated = model.generate(**on_model_device(model, dict(batch)), max_new_tokens=max_new_tokens,
                                   num_return_sequences=n, **generate_kwargs).cpu()
        texts = [t.strip() for t in decode_responses(processor, generated[:, batch["input_ids"].shape[1]:])]
        for row, i in enumerate(idx):   # generate returns an utterance's n sequences side by side
            out[i] = texts[row * n:(row + 1) * n]
    model.train(was_training)
    return out


def transcribe(model, processor, audios: Sequence[np.ndarray], languages: Sequence[str],
               batch_size: int = 32, max_new_tokens: int = 96, progress: str | None = None) -> list[str]:
    """Greedy decoding, one transcript per utterance in the input's order."""
    return [texts[0] for texts in decode_batched(model, processor, audios, languages, batch_size,
                                                 max_new_tokens, progress, do_sample=False)]


def evaluate_dataset(model, processor, dataset, max_utterances: int | None = None,
                     batch_size: int = 32, max_new_tokens: int = 96) -> tuple[dict[str, float], list[dict]]:
    """CER/WER overall and per language on the first `max_utterances` of `dataset`."""
    items = load_first(dataset, len(dataset) if not max_utterances else max_utterances)
    hyps = transcribe(model, processor, [it["audio"] for it in items], [it["language"] for it in items],
                      batch_size=batch_size, max_new_tokens=max_new_tokens, progress="eval")
    refs = [it["text"] for it in items]
    langs = [it["language"] for it in items]
    rows = [{"id": it["id"], "language": it["language"], "ref": r, "hyp": h}
            for it, r, h in zip(items, refs, hyps)]
    return error_rates_by_language(hyps, refs, langs), rows


def evaluation_sets(manifests: CorpusManifests, data_cfg, output_root) -> dict[str, AsrDataset]:
    """Dev, then the held-out-voice split when the manifests have one, then that split under
    each held-out condition (`heldout_conditions/<name>`, rendered on first use and cached
    under `output_root`)."""
    sets = {"dev": AsrDataset(manifests.dev, data_cfg, split="dev")}
    if manifests.heldout_voices is not None:
        sets[HELDOUT_SPLIT] = AsrDataset(manifests.heldout_voices, data_cfg, split=HELDOUT_SPLIT)
    for name, path in heldout_condition_manifests(manifests.heldout_voices, data_cfg, output_root).items():
        split = f"{CONDITIONS_SPLIT}/{name}"
        sets[split] = AsrDataset(path, data_cfg, split=split)
    return sets


def metrics_of_sets(score: Callable[[str, Any], dict[str, float]], sets: dict[str, Any]) -> dict[str, float]:
    """`score(name, dataset)` of every set in one dict: dev's keys as they are, the
    other sets' under `<name>/`."""
    out: dict[str, float] = {}
    for name, dataset in sets.items():
        metrics = score(name, dataset)
        out.update(metrics if name == "dev" else {f"{name}/{k}": v for k, v in metrics.items()})
    return out
