"""What a decode round costs against the rows of a KV batch, what compacting one costs,
and below which share of live rows compacting pays (tiny model, random weights, CPU).

    .venv/bin/python bench/decode_compaction.py      # -> bench/results/decode_compaction.json

The HF engine decodes every row of a KV batch each round: a finished row is masked, not
removed, so it costs as much as a live one until `KVBatch.select` drops the finished
rows (a copy of the kept rows' cache). The engine compacts once the live share of a
batch falls to `COMPACT_BELOW` (0.5). This measures, on the default model config with
random weights (`build_model`) and prompts of the RL corpus' length (~54 tokens):

1. one decode round (`sample_tokens` on the live rows + `KVBatch.extend`, one token per
   row) against the rows, 1..128: the "decode round cost vs live rows" curve;
2. `KVBatch.select` from 64 and 128 rows down to k rows;
3. the total decode cost of a batch of 64 and of 128 rows against the threshold, from
   1 and 2 over realistic finishing patterns (the response lengths of
   `bench/results/bare_loop.json`, the SFT checkpoint's own rollouts, when present; else
   a log-normal fit of them), and that cost measured for a few thresholds by decoding
   with those lengths forced, to check the model;
4. `KVBatch.extend` and the whole round before and after vectorising it (the per-row
   version is read from git at `BEFORE_COMMIT`) at 1 and 64 rows.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "a04df28"   # the last commit with the per-row KVBatch.extend
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
SAMPLES = 8                 # rows per prompt (a GRPO group)
DURATIONS_S = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)   # 26-78 prompt tokens, mean ~55
WARM_TOKENS = 14            # rounds already decoded when timing: the mean response length
THRESHOLDS = tuple(round(x, 3) for x in np.arange(0.0, 1.0001, 0.025))


def best_ms(fn, repeats: int) -> float:
    """Best of `repeats` in ms: other processes on these cores only ever add time."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


# ---- the model and its prompts ---------------------------------------------------------
def build_tiny(cfg):
    """Tokenizer trained on template sentences to the configured vocabulary, processor
    and model with random weights, exactly as SFT builds them before training."""
    from asr_grpo.data.templates import sample_sentence
    from asr_grpo.models import build_model, build_processor, train_tokenizer

    rng = np.random.default_rng(0)
    texts = [sample_sentence(rng, lang).text for _ in range(1000) for lang in ("en", "zh")]
    tokenizer = train_tokenizer(texts, cfg.model.tokenizer_vocab_size)
    return build_processor(tokenizer), build_model(cfg.model, tokenizer, seed=cfg.seed).eval()


def prompt_groups(processor, groups: int) -> list[tuple[list[int], object]]:
    from asr_grpo.models.sequences import encode_prompt

    rng = np.random.default_rng(1)
    audio = [(0.1 * rng.standard_normal(int(16000 * DURATIONS_S[g % len(DURATIONS_S)]))).astype(np.float32)
             for g in range(groups)]
    return [encode_prompt(processor, a, "en" if g % 2 == 0 else "zh") for g, a in enumerate(audio)]


class Decoder:
    """One KV batch decoded the way the HF engine decodes it."""

    def __init__(self, model, processor, cfg, kv_cls):
        from asr_grpo.models.kv_batch import causal_lm_forward

        self.forward, self.pad = causal_lm_forward(model), processor.tokenizer.pad_token_id
        self.kv_cls, self.algo, self.seed = kv_cls, cfg.algorithm, cfg.seed
        self.suppress = torch.as_tensor(model.generation_config.suppress_tokens, dtype=torch.long)
        self.prompts = prompt_groups(processor, -(-max(ROWS) // SAMPLES))

    def batch(self, rows: int, warm: int = WARM_TOKENS):
        """`rows` rows (groups of SAMPLES sharing a prompt) with `warm` tokens decoded."""
        kv = self.kv_cls(self.forward, self.pad)
        prompts = [self.prompts[i // SAMPLES] for i in range(rows)]
        kv.prefill_shared([p for p, _ in prompts], [f for _, f in prompts], [[] for _ in range(rows)])
        if warm:
            kv.extend([[5 + i % 50 for i in range(warm)]] * rows)
        return kv

    def sample(self, kv, active: list[int], position: int) -> torch.Tensor:
        from asr_grpo.rollout.sampling import sample_tokens

        tokens, _ = sample_tokens(kv.last[active], self.algo.temperature, self.algo.top_p, self.seed,
                                  suppress=self.suppress, uids=[f"r{i}" for i in active],
                                  positions=[position] * len(active))
        return tokens

    def round(self, kv, active: list[int], position: int) -> None:
        """A round of the engine: sample for the live rows, feed them their token."""
        tokens = self.sample(kv, active, position).tolist()
        new = [[] for _ in range(len(kv))]
        for j, i in enumerate(active):
            new[i] = [tokens[j]]
        kv.extend(new)


# ---- 1, 2: round and select costs ---------------------------------------------------------
def round_costs(dec: Decoder, repeats: int) -> dict[str, dict[str, float]]:
    """Per rows: the whole round, and its sampling and extend parts, in ms."""
    out = {}
    for n in ROWS:
        kv, everyone = dec.batch(n), list(range(n))
        pos = iter(range(WARM_TOKENS, 10**6))
        whole = best_ms(lambda: dec.round(kv, everyone, next(pos)), repeats)
        sample = best_ms(lambda: dec.sample(kv, everyone, WARM_TOKENS), repeats)
        kv = dec.batch(n)   # the cache as long as the round's was
        extend = best_ms(lambda: kv.extend([[7]] * n), repeats)
        out[str(n)] = {"round_ms": round(whole, 3), "sample_ms": round(sample, 3), "extend_ms": round(extend, 3)}
        print(f"  {n:4d} rows: round {whole:7.2f} ms (sample {sample:5.2f}, extend {extend:6.2f})", flush=True)
    return out


def select_costs(dec: Decoder, repeats: int) -> dict[str, dict[str, float]]:
    """`select` from 64 and 128 rows down to k rows (a copy of the batch each time)."""
    out = {}
    for n in (64, 128):
        kv = dec.batch(n)
        out[str(n)] = {}
        for k in (k for k in ROWS if k < n):
            times = []
            for _ in range(repeats):
                fresh = copy.copy(kv)
                fresh.cache = copy.deepcopy(kv.cache)
                t = time.perf_counter()
                fresh.select(list(range(0, n, n // k))[:k])
                times.append(time.perf_counter() - t)
            out[str(n)][str(k)] = round(1e3 * min(times), 3)
    return out


# ---- 3: the threshold ------------------------------------------------------------------------
def finishing_patterns(rows: int, max_new: int, source: Path | None, count: int = 40) -> list[np.ndarray]:
    """Response lengths of `count` batches of `rows` sequences (a row finishes in the
    round of its last token): consecutive rollouts of bare_loop.json, else a log-normal
    fit of them (per-group median ~13.5, p90 ~23, as in the benchmark runs under bench/results/)."""
    if source is not None:
        steps = [np.asarray(x) for x in json.loads(source.read_text())["response_lengths"]]
        flat = np.concatenate(steps)
        return [np.resize(np.roll(flat, -rows * i), rows) for i in range(min(count, len(flat) // rows))]
    rng = np.random.default_rng(2)
    out = []
    for _ in range(count):
        group = rng.lognormal(np.log(13.5), 0.3, -(-rows // SAMPLES)).repeat(SAMPLES)[:rows]
        out.append(np.clip(np.rint(group * rng.lognormal(0.0, 0.3, rows)), 1, max_new).astype(int))
    return out


def interp(table: dict[str, float]):
    xs = np.array([int(k) for k in table], dtype=float)
    ys = np.array(list(table.values()), dtype=float)
    return lambda x: float(np.interp(x, xs, ys))


def modelled_cost_ms(lengths: np.ndarray, theta: float, forward, sample, select) -> float:
    """Decode cost of one batch under the engine's rule: extend every row of the batch
    each round, compact once live rows <= theta * rows."""
    rows, cost = len(lengths), 0.0
    for r in range(1, int(lengths.max()) + 1):
        cost += sample(int((lengths >= r).sum()))
        live = int((lengths > r).sum())
        if live == 0:
            break
        cost += forward(rows)
        if live <= theta * rows:
            cost += select(live)
            rows = live
    return cost


def measured_cost_ms(dec: Decoder, lengths: np.ndarray, theta: float) -> float:
    """The same loop, run: each row's sampled tokens are kept, its length is forced."""
    kv = dec.batch(len(lengths), warm=0)
    rows = list(range(len(lengths)))   # batch row -> sequence
    t = time.perf_counter()
    for r in range(1, int(lengths.max()) + 1):
        active = [i for i, s in enumerate(rows) if lengths[s] >= r]
        tokens = dec.sample(kv, active, r).tolist()
        new = [[] for _ in rows]
        for j, i in enumerate(active):
            if lengths[rows[i]] > r:
                new[i] = [tokens[j]]
        if not any(new):
            break
        kv.extend(new)
        keep = [i for i, s in enumerate(rows) if lengths[s] > r]
        if keep and len(keep) <= theta * len(rows):
            kv.select(keep)
            rows = [rows[i] for i in keep]
    return 1e3 * (time.perf_counter() - t)


def threshold_study(dec: Decoder, costs: dict, selects: dict, max_new: int, source: Path | None,
                    check_patterns: int, check_repeats: int = 3) -> dict:
    forward = interp({k: v["extend_ms"] for k, v in costs.items()})
    sample = interp({k: v["sample_ms"] for k, v in costs.items()})
    out = {}
    for n in (64, 128):
        select = interp(selects[str(n)])
        patterns = finishing_patterns(n, max_new, source)
        curve = {t: float(np.mean([modelled_cost_ms(p, t, forward, sample, select) for p in patterns]))
                 for t in THRESHOLDS}
        best = min(curve, key=curve.get)
        never = curve[0.0]
        checks = sorted({0.0, 0.25, 0.5, 0.75, best, 1.0})
        measured = {t: float(np.mean([min(measured_cost_ms(dec, p, t) for _ in range(check_repeats))
                                      for p in patterns[:check_patterns]])) for t in checks}
        out[str(n)] = {
            "patterns": len(patterns),
            "mean_length": float(np.mean([p.mean() for p in patterns])),
            "mean_max_length": float(np.mean([p.max() for p in patterns])),
            "modelled_decode_ms_by_threshold": {str(t): round(v, 2) for t, v in curve.items()},
            "best_threshold": best,
            "near_best_thresholds": [t for t, v in curve.items() if v <= 1.01 * curve[best]],
            "modelled_saving_vs_never": round(1 - curve[best] / never, 4),
            "modelled_saving_vs_0.5": round(1 - curve[best] / curve[0.5], 4),
            "measured_decode_ms_by_threshold": {str(t): round(v, 2) for t, v in measured.items()},
            "measured_patterns": check_patterns,
        }
        print(f"  {n} rows: best threshold {best} (modelled {curve[best]:.1f} ms vs {curve[0.5]:.1f} at 0.5, "
              f"{never:.1f} never); measured {json.dumps(out[str(n)]['measured_decode_ms_by_threshold'])}",
              flush=True)
    return out


# ---- 4: KVBatch before / after ---------------------------------------------------------------
def kvbatch_before():
    """The per-row KVBatch of BEFORE_COMMIT, loaded from git as its own module."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE_COMMIT}:src/asr_grpo/models/kv_batch.py"],
                         capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("kv_batch_before")
    exec(compile(src, "kv_batch_before.py", "exec"), module.__dict__)
    return module.KVBatch


class _StubCache:
    def batch_select_indices(self, index) -> None:
        pass


def overhead_ms(kv_cls, rows: int, vocab: int, repeats: int = 500) -> dict[str, float]:
    """`extend`'s own cost, the model's forward replaced by a stub that returns ready
    logits: what vectorising removed, without the forward's noise on top."""
    logits = torch.zeros(rows, 1, vocab)

    def forward(input_ids, **_):
        return (logits if input_ids.shape[1] == 1 else torch.zeros(*input_ids.shape, vocab)), _StubCache()

    kv = kv_cls(forward, 0)
    kv.prefill([[1] * 55] * rows, [0] * rows)
    everyone, mixed = [[7]] * rows, [[] if i % 4 == 3 else [7] for i in range(rows)]
    return {"all_rows_ms": round(best_ms(lambda: kv.extend(everyone), repeats), 4),
            "quarter_finished_ms": round(best_ms(lambda: kv.extend(mixed), repeats), 4)}


def before_after(model, processor, cfg, repeats: int, blocks: int = 6) -> dict:
    """One decode round (sample + extend) with the model, before and after, interleaved
    so drift in the machine's load hits both alike, on fresh batches every `repeats`
    rounds (a batch's cache grows a column a round); and `extend`'s own overhead."""
    from asr_grpo.models.kv_batch import KVBatch

    classes = {"before": kvbatch_before(), "after": KVBatch}
    decs = {k: Decoder(model, processor, cfg, cls) for k, cls in classes.items()}
    vocab = model.config.text_config.vocab_size
    out = {}
    for n in (1, 64):
        times: dict[str, list[float]] = {k: [] for k in decs}
        for _ in range(blocks):
            kvs = {k: d.batch(n) for k, d in decs.items()}
            for rep in range(repeats):
                for k, d in decs.items():
                    t = time.perf_counter()
                    d.round(kvs[k], list(range(n)), WARM_TOKENS + rep)
                    times[k].append(1e3 * (time.perf_counter() - t))
        row = {f"{k}_round_ms": round(min(v), 3) for k, v in times.items()}
        row["round_speedup"] = round(row["before_round_ms"] / row["after_round_ms"], 3)
        row["extend_overhead_ms"] = {k: overhead_ms(cls, n, vocab) for k, cls in classes.items()}
        out[str(n)] = row
        print(f"  {n} rows: {row}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the rollout actor's default: 1)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--check-patterns", type=int, default=6, help="finishing patterns decoded for real per threshold")
    ap.add_argument("--lengths", type=Path, default=REPO / "bench" / "results" / "bare_loop.json",
                    help="a bare_loop.json whose response lengths give the finishing patterns (else log-normal)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "decode_compaction.json")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (model.*, algorithm.*)")
    args = ap.parse_intermixed_args()   # overrides before or after the options

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from overlap_speedup import compose_run

    from asr_grpo.models.kv_batch import KVBatch

    torch.set_num_threads(args.threads)
    cfg = compose_run(args.overrides)
    load_before = os.getloadavg()[0]
    processor, model = build_tiny(cfg)
    source = args.lengths if args.lengths and args.lengths.is_file() else None
    dec = Decoder(model, processor, cfg, KVBatch)
    print("decode round vs rows:", flush=True)
    costs = round_costs(dec, args.repeats)
    selects = select_costs(dec, max(5, args.repeats // 3))
    print("threshold:", flush=True)
    study = threshold_study(dec, costs, selects, cfg.algorithm.max_new_tokens, source, args.check_patterns)
    print("KVBatch before/after:", flush=True)
    versus = before_after(model, processor, cfg, max(5, args.repeats // 3))
    result = {
        "setup": {"threads": args.threads, "repeats": args.repeats, "overrides": args.overrides,
                  "model": {k: cfg.model[k] for k in ("text_layers", "text_hidden", "tokenizer_vocab_size")},
                  "prompt_tokens_mean": round(float(np.mean([len(p) for p, _ in dec.prompts])), 1),
                  "warm_tokens": WARM_TOKENS, "samples_per_prompt": SAMPLES,
                  "finishing_patterns": str(source.relative_to(REPO)) if source else "log-normal fit",
                  "kvbatch_before_commit": BEFORE_COMMIT,
                  # Other processes on these cores inflate the times: the 1-min load average says how much.
                  "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}},
        "decode_round_ms_by_rows": {k: v["round_ms"] for k, v in costs.items()},
        "decode_round_parts_ms_by_rows": costs,
        "select_ms_from_to": selects,
        "compaction": study,
        "recommended_threshold": {n: s["best_threshold"] for n, s in study.items()},
        "kvbatch_before_after": versus,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("decode_round_ms_by_rows", "recommended_threshold")}, indent=1))


if __name__ == "__main__":
    main()
