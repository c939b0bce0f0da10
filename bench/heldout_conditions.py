"""Greedy CER of checkpoints on dev, the held-out voices and each held-out acoustic
condition (data.heldout_conditions: a reverberant room, a telephone line, noise), side by
side, with each condition's CER over dev's: how far recognition falls outside the studio.

    python bench/heldout_conditions.py --out bench/results/cpu_2core_conditions/sft.json \\
        plain=outputs/checkpoints/sft-plain augmented=outputs/checkpoints/sft-tiny [-o data.KEY=VALUE ...]

Each NAME=PATH is an HF checkpoint folder (an SFT output, an RL step's hf/ or hf_ema/). The
sets are the embedded corpus' (or your manifests', with -o overrides), the held-out
conditions rendered on first use and cached. Writes the JSON and a markdown table beside it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from portable import code_commit, cpu_name, portable


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("config", overrides=overrides)


def evaluate(path: str, sets: dict, batch_size: int) -> dict[str, dict[str, float]]:
    from asr_grpo.evaluation import evaluate_dataset
    from asr_grpo.models import load_model

    model, processor = load_model(path)
    out = {}
    for name, dataset in sets.items():
        start = time.monotonic()
        metrics, _ = evaluate_dataset(model, processor, dataset, batch_size=batch_size)
        out[name] = {**metrics, "seconds": round(time.monotonic() - start, 1)}
        print(f"{path}: {name} CER {metrics['cer']:.3f} ({len(dataset)} utterances, {out[name]['seconds']} s)",
              flush=True)
    return out


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    names = list(next(iter(results.values())))
    head = "| checkpoint | " + " | ".join(names) + " | worst condition / dev |"
    rows = [head, "|" + " --- |" * (len(names) + 2)]
    for ckpt, sets in results.items():
        dev = sets["dev"]["cer"]
        worst = max((v["cer"] for k, v in sets.items() if k.startswith("heldout_conditions/")), default=float("nan"))
        cells = [f"{100 * sets[n]['cer']:.1f}%" + ("" if n == "dev" else f" ({sets[n]['cer'] / dev:.2f}x)")
                 for n in names]
        rows.append(f"| {ckpt} | " + " | ".join(cells) + f" | {worst / dev:.2f}x |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", help="NAME=PATH of an HF checkpoint folder")
    parser.add_argument("--out", required=True, help="JSON result (a .md table is written beside it)")
    parser.add_argument("-o", "--override", action="append", default=[], help="a config override (data.*)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    pairs = [c.split("=", 1) for c in args.checkpoints]
    if any(len(p) != 2 for p in pairs):
        parser.error("each checkpoint is NAME=PATH")
    torch.set_num_threads(2)
    from asr_grpo.data import resolve_manifests
    from asr_grpo.evaluation import evaluation_sets

    cfg = compose(args.override)
    sets = evaluation_sets(resolve_manifests(cfg.data, cfg.paths.output_root), cfg.data, cfg.paths.output_root)
    results = {name: evaluate(path, sets, args.batch_size) for name, path in pairs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": f"{cpu_name()}, {torch.get_num_threads()} threads", "code_commit": code_commit(),
              "command": portable("python bench/heldout_conditions.py " + " ".join(
                  [f"--out {args.out}"] + [f"-o {o}" for o in args.override] + args.checkpoints)),
              "checkpoints": {name: portable(path) for name, path in pairs}, "results": results}
    out.write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"{record['machine']}, code {record['code_commit']}\n\n"
                                      f"`{record['command']}`\n\n" + table(results))
    print(table(results))


if __name__ == "__main__":
    main()
