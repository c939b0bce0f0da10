"""Where a GRPO rollout and its scoring spend their time on CPU, side by side in one run.

    python bench/prompt_prefill.py            # SFT checkpoint, 8 RL prompts x 8 samples, 1 thread

1. The prompt prefill of a rollout batch: every row prefilled whole (what the engine
   did before) vs each prompt once, its cache copied to its n samples (`prefill_shared`).
2. One-shot reference log-probs of the sampled batch: a full forward per micro-batch
   vs `score_once` (shared prompt prefill, then the responses).
3. One training micro-batch (forward + backward of the response log-probs, audio
   encoder frozen as in RL): every row run whole vs each utterance encoded once
   (`share_audio`) vs each prompt also run through the LM once (`share_prompt`), for a
   micro-batch drawn as the trainer draws it by default (whole groups,
   `trainer.micro_batch_by_group`) and with the samples shuffled one by one (a prompt
   then has fewer rows in it).
4. The cost of one decode round against the number of live sequences: how much of a
   round is fixed overhead and how much grows with the batch. OPPO's overcommit cuts
   decode rounds; it pays only where a round with few live sequences costs about as
   much as a full one.

Writes `<out>/prompt_prefill.json` (and prints it). The shared and per-row paths must
agree to float rounding; the largest difference is reported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the rollout actor's default: 1)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()

    from overlap_speedup import compose_run

    from asr_grpo.algorithms import logprobs_from_logits
    from asr_grpo.data import AsrDataset, resolve_manifests
    from asr_grpo.models import load_model, set_audio_encoder_frozen
    from asr_grpo.models.kv_batch import KVBatch, causal_lm_forward
    from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logits, response_logprobs
    from asr_grpo.models.streaming import score_once, token_logprobs
    from asr_grpo.recipes.start_checkpoint import prepare_start_checkpoint
    from asr_grpo.rollout.hf_engine import HFChunkedEngine
    from asr_grpo.rollout.types import RolloutRequest
    from asr_grpo.workers.rollout_host import sampling_params
    from asr_grpo.workers.training import micro_batches

    torch.set_num_threads(args.threads)
    cfg = compose_run([])
    model, processor = load_model(prepare_start_checkpoint(cfg))
    model.eval()
    tok = processor.tokenizer
    data = AsrDataset(resolve_manifests(cfg.data, cfg.paths.output_root).rl_prompts, cfg.data)
    prompts = [encode_prompt(processor, data[i]["audio"], data[i]["language"]) for i in range(args.prompts)]
    rows = [(p, f) for p, f in prompts for _ in range(args.samples)]   # one features object per group
    forward = causal_lm_forward(model)
    pad = tok.pad_token_id

    def per_row():
        kv = KVBatch(forward, pad)
        kv.prefill([p for p, _ in rows], [0] * len(rows), [f for _, f in rows])
        return kv.last

    def shared():
        kv = KVBatch(forward, pad)
        kv.prefill_shared([p for p, _ in rows], [f for _, f in rows], [[] for _ in rows])
        return kv.last

    t_row, last_row = timed(per_row, args.repeats)
    t_shared, last_shared = timed(shared, args.repeats)

    # A real sampled batch to score: the engine's own rollout of these prompts.
    engine = HFChunkedEngine(model, model.generation_config.eos_token_id, pad, sampling_params(cfg.algorithm, cfg.seed),
                             max_batch_size=len(rows), suppress_token_ids=model.generation_config.suppress_tokens)
    engine.add_requests([RolloutRequest(f"{i // args.samples}#{i % args.samples}", str(i // args.samples), p, f)
                         for i, (p, f) in enumerate(rows)])
    t_rollout, _ = timed(lambda: engine.decode(None), 1)
    done = {s.request.uid: s for s in engine.pop_finished()}
    uids = [f"{i // args.samples}#{i % args.samples}" for i in range(len(rows))]
    responses = [done[u].tokens for u in uids]
    micro = int(cfg.trainer.micro_batch_size)
    temperature = float(cfg.algorithm.temperature)

    def full_forward():
        out = []
        for s in range(0, len(rows), micro):
            batch = pack_sequences([p for p, _ in rows[s:s + micro]], responses[s:s + micro],
                                   [f for _, f in rows[s:s + micro]], pad)
            with torch.no_grad():
                lp = response_logprobs(model, batch, temperature)
            out += [lp[i, :len(responses[s + i])] for i in range(lp.shape[0])]
        return out

    def shared_scoring():
        with torch.no_grad():
            return score_once(lambda: forward, pad, token_logprobs(temperature), uids, [p for p, _ in rows],
                              [f for _, f in rows], responses, max_batch_size=micro)

    t_full, lp_full = timed(full_forward, args.repeats)
    t_once, lp_once = timed(shared_scoring, args.repeats)

    # Training micro-batches of `micro` rows, drawn as the trainer draws them: by group (the default) and by sample.
    set_audio_encoder_frozen(model, True)
    samples = [SimpleNamespace(index=i, group=i // args.samples) for i in range(len(rows))]
    train_rows = {name: [s.index for s in micro_batches(samples, micro, np.random.default_rng(0), by_group)[0]]
                  for name, by_group in (("by_group", True), ("samples_shuffled", False))}

    def train_pass(batch, share_audio: bool, share_prompt: bool):
        def step():
            model.zero_grad(set_to_none=True)
            logits = response_logits(model, batch, share_audio=share_audio, share_prompt=share_prompt)
            logprobs_from_logits(logits.float() / temperature, batch.response_ids).sum().backward()
            return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return step

    def max_rel_diff(grads, ref):
        return max(float((grads[n] - g).abs().max() / g.abs().max()) for n, g in ref.items() if g.abs().max() > 0)

    train = {}
    for name, picked in train_rows.items():
        batch = pack_sequences([rows[i][0] for i in picked], [responses[i] for i in picked],
                               [rows[i][1] for i in picked], pad)
        t_whole, g_whole = timed(train_pass(batch, False, False), args.repeats)
        t_audio, g_audio = timed(train_pass(batch, True, False), args.repeats)
        t_prompt, g_prompt = timed(train_pass(batch, True, True), args.repeats)
        train[name] = {"rows": micro, "prompts": len(batch.prompt_rows[0]), "every_row_whole": round(t_whole, 4),
                       "audio_per_utterance": round(t_audio, 4), "prompt_per_group": round(t_prompt, 4),
                       "speedup_audio": round(t_whole / t_audio, 2), "speedup_prompt": round(t_whole / t_prompt, 2),
                       "max_rel_grad_diff": max(max_rel_diff(g_audio, g_whole), max_rel_diff(g_prompt, g_whole))}
    model.zero_grad(set_to_none=True)

    # Decode-round cost against live sequences (same prompts, one token per round).
    rounds = {}
    for b in (1, 2, 4, 8, 16, 32, 64):
        if b > len(rows):
            break
        kv = KVBatch(forward, pad)
        kv.prefill_shared([p for p, _ in rows[:b]], [f for _, f in rows[:b]], [[] for _ in range(b)])
        kv.extend([[tok.eos_token_id]] * b)
        t = time.perf_counter()
        for _ in range(20):
            kv.extend([[tok.eos_token_id]] * b)
        rounds[str(b)] = round((time.perf_counter() - t) / 20 * 1e3, 3)

    lengths = [len(r) for r in responses]
    result = {
        "setup": {"prompts": args.prompts, "samples_per_prompt": args.samples, "threads": args.threads,
                  "checkpoint": str(cfg.model.path),
                  "prompt_tokens_mean": round(sum(len(p) for p, _ in prompts) / len(prompts), 1),
                  "response_tokens_mean": round(sum(lengths) / len(lengths), 1), "response_tokens_max": max(lengths)},
        "rollout_prefill_s": {"per_row": round(t_row, 4), "shared": round(t_shared, 4),
                              "speedup": round(t_row / t_shared, 2),
                              "max_abs_diff_logits": float((last_row - last_shared).abs().max())},
        "rollout_decode_s": round(t_rollout, 4),
        "reference_logprobs_s": {"full_forward": round(t_full, 4), "shared_prompt": round(t_once, 4),
                                 "speedup": round(t_full / t_once, 2),
                                 "max_abs_diff": max(float((a - b).abs().max()) if len(a) else 0.0
                                                     for a, b in zip(lp_full, lp_once))},
        "train_micro_batch_s": train,
        "decode_round_ms_by_live_sequences": rounds,
        "decode_round_fixed_share_at_64": round(rounds["1"] / rounds["64"], 3) if "64" in rounds else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prompt_prefill.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
