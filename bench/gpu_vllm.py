"""rollout=vllm end to end on a GPU machine, in one command:

    pip install -e ".[vllm,dev]"          # after a CUDA torch
    python bench/gpu_vllm.py               # ~5 min on one GPU; writes bench/results/gpu_vllm.json

On one GPU everything is colocated (actor 0.5, reference 0.1, vLLM engine 0.4 of the
bundle; weight sync over gloo, since NCCL refuses two ranks on one device; use
`--separate` on a machine with 3+ GPUs for the NCCL path). Phases, each recorded in the
JSON as it finishes (a failure is recorded and the run goes on where it can):

1. setup: a tiny corpus and a seconds-long SFT checkpoint (debug=fast sizes) under
   --root, then the RL recipe with rollout=vllm (Ray, DeepSpeed, one vLLM engine actor);
2. sync_before: log-probs of fixed sequences (dev prompts + their reference
   transcripts) from the trainer and from the engine, which loaded the same checkpoint;
3. throughput: the same requests (--prompts x n samples, to --max-new-tokens) decoded
   to the end by the HF engine (the actor rank) and by vLLM: generated tokens per second;
4. grpo: --steps GRPO steps with overlap=oppo (chunked decoding, carried sequences
   continued as new requests), a weight sync after each update, checked after each
   (rollout.sync_check_every=1 at --tol: a mismatch fails the phase);
5. sync_after: the trainer's and the engine's log-probs of the same fixed sequences after
   the last sync must agree (max |diff| < --tol), while the weights have moved (the engine
   before vs after differ by more than --tol);
6. hf_steps (skip with --no-hf-baseline): the same GRPO steps with rollout=hf, for step times.

Exit status 0 only when the sync check passed. Without CUDA or vLLM it writes the
reason to the JSON and exits 2.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


def overrides(args, engine: str) -> list[str]:
    place = (["placement=separate", "placement.gpus_per_node=3"] if args.separate else
             ["placement=colocate", "placement.gpus_per_node=1", "placement.actor_gpus=0.5",
              "placement.ref_gpus=0.1", "placement.rollout_gpus=0.4"])
    return ["debug=fast", f"paths.output_root={args.root}", f"rollout={engine}", *place,
            f"trainer.steps={args.steps}", "trainer.prompts_per_step=8", "algorithm.n_samples_per_prompt=8",
            f"algorithm.max_new_tokens={args.max_new_tokens}", "algorithm.temperature=1.0",
            "trainer.rollout_batch_size=512", "trainer.micro_batch_size=32", f"trainer.lr={args.lr}",
            "trainer.lr_warmup_steps=0", "trainer.eval_every=0", "trainer.save_every=0",
            "overlap=oppo", "overlap.chunk_size=16", "overlap.delta_init=2",
            "data.corpus.num_train=128", "data.corpus.num_dev=32",
            "rollout.gpu_memory_utilization=0.25", "rollout.sync_check_every=1", f"rollout.sync_check_tol={args.tol}",
            *args.override]


def fixed_sequences(recipe, count: int):
    """Dev prompts with their reference transcripts + EOS as the responses."""
    from asr_grpo.experience.types import SequenceRef
    from asr_grpo.models.sequences import encode_prompt

    tok = recipe.processor.tokenizer
    refs = []
    for i in range(min(count, len(recipe.dev_set))):
        item = recipe.dev_set[i]
        prompt_ids, feats = encode_prompt(recipe.processor, item["audio"], item["language"])
        response = tok(item["text"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        refs.append(SequenceRef(f"fixed{i}", prompt_ids, response, feats, item["language"]))
    return refs


def logprobs(group, refs) -> list:
    """Rank 0's log-probs of `refs` at temperature 1 (what a vLLM engine can score)."""
    import ray

    return ray.get(group.call_rank(0, "compute_logprobs", refs, 1.0))


def decode_throughput(group, requests) -> dict:
    """All requests into rank 0 of `group`, decoded to the end: generated tokens / s."""
    import ray

    ray.get(group.call_rank(0, "add_requests", requests))
    t0 = time.monotonic()
    done = []
    while True:
        done += ray.get(group.call_rank(0, "decode", None))
        if ray.get(group.call_rank(0, "num_live")) == 0:
            break
    seconds = time.monotonic() - t0
    tokens = sum(len(r.tokens) for r in done if r.done)
    return {"sequences": len(requests), "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def throughput_requests(recipe, prompts: int, tag: str):
    from asr_grpo.experience.prompts import build_group

    out = []
    for i in range(prompts):
        item = recipe.train_set[i % len(recipe.train_set)]
        out += build_group(recipe.processor, item, recipe.cfg.algorithm.n_samples_per_prompt,
                           f"{tag}{i}", 0, i).requests()
    return out


def grpo_steps(recipe, steps: int) -> dict:
    rows = []
    for step in range(steps):
        m = recipe.train_step(step)
        rows.append({k: m[k] for k in ("perf/time/step", "perf/time/rollout", "perf/time/training",
                                       "perf/time/sync", "reward/total", "overlap/decode_rounds",
                                       "overlap/carried_groups") if k in m})
    step_s = [r["perf/time/step"] for r in rows]
    return {"steps": rows, "median_step_s": statistics.median(step_s),
            "median_rollout_s": statistics.median(r["perf/time/rollout"] for r in rows),
            "median_sync_s": statistics.median(r["perf/time/sync"] for r in rows)}


class Report:
    def __init__(self, path: Path, **header):
        self.path, self.data = path, {"phases": {}, **header}

    def run(self, name: str, fn, *args):
        t0 = time.monotonic()
        try:
            result = fn(*args)
            self.data["phases"][name] = {"ok": True, "seconds": time.monotonic() - t0, **(result or {})}
            return result
        except Exception as e:
            self.data["phases"][name] = {"ok": False, "seconds": time.monotonic() - t0,
                                         "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            return None
        finally:
            self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="outputs/gpu_vllm", help="corpus, checkpoints and the vLLM export go here")
    p.add_argument("--out", default=str(BENCH / "results" / "gpu_vllm.json"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=32, help="prompts (x 8 samples) for the throughput phase")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="large enough that 3 steps visibly move the weights")
    p.add_argument("--tol", type=float, default=2e-3, help="max |trainer - engine| log-prob after a sync")
    p.add_argument("--separate", action="store_true", help="3+ GPUs: engine on its own GPU, NCCL sync")
    p.add_argument("--no-hf-baseline", action="store_true")
    p.add_argument("override", nargs="*", help="extra Hydra overrides")
    args = p.parse_args()
    out = Path(args.out)

    import torch

    report = Report(out, command=" ".join(sys.argv), torch=torch.__version__)
    missing = [why for ok, why in ((torch.cuda.is_available(), "no CUDA device"),
                                   (importlib.util.find_spec("vllm") is not None, "vllm is not installed"))
               if not ok]
    if missing:
        report.data.update(status="skipped", reason="; ".join(missing))
        report.write()
        print(f"gpu_vllm: skipped ({'; '.join(missing)}); wrote {out}")
        return 2
    import vllm

    from asr_grpo.config.validate import validate_config
    from asr_grpo.experience.sync_check import compare_logprobs
    from asr_grpo.recipes.rl import RLRecipe
    from overlap_speedup import compose_run

    report.data.update(vllm=vllm.__version__, device=torch.cuda.get_device_name(0), overrides=overrides(args, "vllm"))
    cfg = compose_run(overrides(args, "vllm"))
    validate_config(cfg)
    recipe = RLRecipe(cfg, "gpu-vllm")
    try:
        report.run("setup", recipe.setup)
        if not report.data["phases"]["setup"]["ok"]:
            report.data["status"] = "failed"
            report.write()
            print(f"gpu_vllm: setup failed; wrote {out}")
            return 1
        refs = fixed_sequences(recipe, 16)
        state = {}

        def sync_check(tag: str) -> dict:
            trainer, engine = logprobs(recipe.policy, refs), logprobs(recipe.rollout_group, refs)
            state[tag] = engine
            cmp = compare_logprobs(trainer, engine)
            worst = cmp.max_abs_diff
            return {"max_abs_diff": worst, "mean_abs_diff": cmp.mean_abs_diff, "tokens": cmp.tokens,
                    "agree": worst < args.tol}

        report.run("sync_before", sync_check, "before")

        def throughput() -> dict:
            warm = throughput_requests(recipe, 2, "warm")
            decode_throughput(recipe.rollout_group, warm)
            decode_throughput(recipe.policy, warm)
            reqs = throughput_requests(recipe, args.prompts, "tp")
            hf = decode_throughput(recipe.policy, reqs)
            vl = decode_throughput(recipe.rollout_group, reqs)
            return {"hf": hf, "vllm": vl, "speedup": vl["tokens_per_s"] / hf["tokens_per_s"]}

        report.run("throughput", throughput)
        report.run("grpo", grpo_steps, recipe, args.steps)

        def sync_after() -> dict:
            result = sync_check("after")
            if "before" in state:
                result["engine_moved_max_abs"] = compare_logprobs(state["before"], state["after"]).max_abs_diff
                result["weights_moved"] = result["engine_moved_max_abs"] > args.tol
            return result

        report.run("sync_after", sync_after)
    finally:
        recipe.cleanup()
    if not args.no_hf_baseline:
        def hf_steps() -> dict:
            hf_recipe = RLRecipe(compose_run(overrides(args, "hf")), "gpu-hf")
            try:
                hf_recipe.setup()
                return grpo_steps(hf_recipe, args.steps)
            finally:
                hf_recipe.cleanup()

        report.run("hf_steps", hf_steps)
    after = report.data["phases"].get("sync_after", {})
    passed = bool(after.get("ok") and after.get("agree") and after.get("weights_moved"))
    report.data["status"] = "passed" if passed else "failed"
    report.write()
    print(json.dumps({k: {f: v for f, v in ph.items() if f != "traceback"}
                      for k, ph in report.data["phases"].items()}, indent=2, default=str)[:6000])
    print(f"gpu_vllm: {report.data['status']}; wrote {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
