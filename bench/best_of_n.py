"""How much better than its greedy transcript a checkpoint already samples: greedy CER,
the mean CER of single samples, and best-of-k CER (the sample with the fewest errors
against the reference, per utterance) on the first utterances of dev and of the
held-out-voice split. The gap between greedy and best-of-k is what a reward computed
from those samples can pull the greedy transcript toward; run it on an SFT and an RL
checkpoint side by side to see whether RL moved greedy into that gap or narrowed it.

    python bench/best_of_n.py CHECKPOINT [CHECKPOINT ...] [--utterances 100] [--samples 16]
        [--temperature 0.8] [--seed 0] [--out best_of_n.json]

Prints a markdown table; --out also writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from asr_grpo.config.schema import DataConfig
from asr_grpo.data import resolve_manifests
from asr_grpo.evaluation import decode_batched, evaluation_sets, load_first, transcribe
from asr_grpo.models import load_model
from asr_grpo.rewards.text import char_error_rate, utterance_cer


def summarize(refs: Sequence[str], languages: Sequence[str], greedy: Sequence[str],
              samples: Sequence[Sequence[str]], ks: Sequence[int]) -> dict[str, float]:
    """Corpus CERs of the greedy transcripts, of the k-th sample (mean over k), and of the
    best of the first k samples per utterance; the share of utterances where one of all
    samples beats greedy."""
    n = min(len(s) for s in samples)
    errors = [[utterance_cer(h, r, lang) for h in hs[:n]] for hs, r, lang in zip(samples, refs, languages)]
    greedy_errors = [utterance_cer(h, r, lang) for h, r, lang in zip(greedy, refs, languages)]
    out = {"greedy": char_error_rate(list(greedy), list(refs), list(languages)),
           "sample_mean": float(np.mean([char_error_rate([hs[j] for hs in samples], list(refs), list(languages))
                                         for j in range(n)]))}
    for k in ks:
        best = [hs[int(np.argmin(e[:k]))] for hs, e in zip(samples, errors)]
        out[f"best_of_{k}"] = char_error_rate(best, list(refs), list(languages))
    out["sample_beats_greedy_frac"] = float(np.mean([min(e) < g for e, g in zip(errors, greedy_errors)]))
    return out


def sample_transcripts(model, processor, items: list[dict], n: int, temperature: float,
                       batch_size: int = 16, max_new_tokens: int = 96) -> list[list[str]]:
    """n sampled transcripts per utterance (plain ancestral sampling, no top-p)."""
    return decode_batched(model, processor, [it["audio"] for it in items], [it["language"] for it in items],
                          batch_size, max_new_tokens, num_return_sequences=n, do_sample=True,
                          temperature=temperature, top_p=1.0, top_k=0)


def checkpoint_headroom(path: str, sets: dict, utterances: int, n: int, temperature: float, seed: int) -> dict:
    model, processor = load_model(path, "float32")
    model.eval()
    result = {}
    for name, dataset in sets.items():
        torch.manual_seed(seed)
        items = load_first(dataset, utterances)
        refs, langs = [it["text"] for it in items], [it["language"] for it in items]
        greedy = transcribe(model, processor, [it["audio"] for it in items], langs)
        samples = sample_transcripts(model, processor, items, n, temperature)
        result[name] = summarize(refs, langs, greedy, samples, sorted({1, 4, 8, n} & set(range(1, n + 1))))
    return result


def table(results: dict[str, dict]) -> str:
    keys = list(next(iter(next(iter(results.values())).values())))
    lines = ["| checkpoint | set | " + " | ".join(keys) + " |", "|" + " --- |" * (len(keys) + 2)]
    for path, sets in results.items():
        for name, row in sets.items():
            lines.append(f"| {path} | {name} | " + " | ".join(f"{100 * row[k]:.1f}%" for k in keys) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--utterances", type=int, default=100)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-root", default="outputs", help="where the embedded corpus lives")
    ap.add_argument("--out")
    args = ap.parse_args()
    data = OmegaConf.structured(DataConfig)
    sets = evaluation_sets(resolve_manifests(data, args.output_root), data)
    results = {p: checkpoint_headroom(p, sets, args.utterances, args.samples, args.temperature, args.seed)
               for p in args.checkpoints}
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"utterances": args.utterances, "samples": args.samples, "temperature": args.temperature,
                       "seed": args.seed, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
