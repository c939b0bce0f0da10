"""Measure a cost table for `python -m asr_grpo.forecast profile=file cost_file=...`.

    python bench/gpu_profile.py --out bench/results/gpu_profile.json             # GPU: Qwen3-ASR-1.7B shape
    python bench/gpu_profile.py --shape tiny_qwen3_asr --out /tmp/cpu_profile.json  # CPU: scaled down

A Qwen3-ASR of the shape in conf/forecast_model/<shape>.yaml is built with random weights
by the project's builder (src/asr_grpo/models/builder.py), and timed through the
project's own paths:
- decode round vs live rows: `KVBatch.extend` of one token per row (the HF engine's
  forward, logits copied to the host) plus `sample_tokens`, after a prompt prefill of
  `--context` tokens per row; with `--contexts`, again at every context length given
  (`decode_round_s_by_context`; the forecast reads `decode_round_s`, the first);
- forward call and prefill tokens/s: `KVBatch.prefill` of one short row, and of many
  tokens (what scoring and the engine's rebuild cost);
- training tokens/s: forward + backward of the policy (LM loss) and of the critic
  (`ValueModel`: the backbone with a value head) on a batch, and the optimizer step alone
  (AdamW over the trainable weights, the encoder frozen);
- weight sync: copying every trainable weight into a second copy on the same device
  (what a colocated engine's weight load costs; an NCCL broadcast across GPUs is slower).
Each measurement is the median of a few repeats after a warm-up. Sized for a few minutes
of device time for 1.7B (not yet run on a GPU); the tiny shape on
one CPU thread takes seconds, which is how it is tested.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
FORMAT = "asr-grpo-cost-table/1"


class ShapeTokenizer:
    """The token ids a Qwen3-ASR config needs, inside a vocabulary of the shape's size (no
    text is ever tokenized: the weights are random)."""

    def __init__(self, vocab: int):
        from asr_grpo.models.tokenizer import AUDIO_END, AUDIO_PAD, AUDIO_START, IM_END, PAD_TOKEN

        self.audio_token, self.audio_bos_token, self.audio_eos_token = AUDIO_PAD, AUDIO_START, AUDIO_END
        names = [PAD_TOKEN, IM_END, AUDIO_PAD, AUDIO_START, AUDIO_END]
        self.ids = {name: vocab - 1 - i for i, name in enumerate(names)}
        self.vocab = vocab
        self.pad_token_id = self.ids[PAD_TOKEN]
        self.all_special_ids = list(self.ids.values())

    def __len__(self) -> int:
        return self.vocab

    def convert_tokens_to_ids(self, tokens):
        return [self.ids[t] for t in tokens] if isinstance(tokens, list) else self.ids[tokens]


def model_config(shape) -> "object":
    """The project's ModelConfig for a forecast shape (the builder derives head_dim = hidden / heads)."""
    from asr_grpo.config.schema import ModelConfig

    enc_layers = 24 if shape.audio_encoder_params >= 2e8 else (18 if shape.audio_encoder_params >= 1e8 else 1)
    enc_d = 1024 if enc_layers == 24 else (896 if enc_layers == 18 else 64)
    return ModelConfig(encoder_layers=enc_layers, encoder_d_model=enc_d, encoder_heads=max(2, enc_d // 64),
                       encoder_ffn_dim=4 * enc_d, encoder_downsample_hidden=480 if enc_layers > 1 else 16,
                       text_layers=shape.layers, text_hidden=shape.hidden, text_heads=shape.heads,
                       text_kv_heads=shape.kv_heads, text_intermediate=shape.intermediate,
                       text_head_dim=int(shape.head_dim or 0),
                       dtype="bfloat16" if torch.cuda.is_available() else "float32")


def timed(fn, repeats: int, sync) -> float:
    fn()   # warm-up (kernels, allocator)
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default=None, help="conf/forecast_model/<shape>.yaml (GPU: qwen3_asr_1p7b, CPU: tiny)")
    ap.add_argument("--rows", default=None, help="comma-separated live-row counts to time a decode round at")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens per row before the timed rounds")
    ap.add_argument("--contexts", default=None,
                    help="comma-separated context lengths to time the rounds at (the first is --context's)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (GPU 5, CPU 2)")
    args = ap.parse_args()

    from asr_grpo.models.builder import build_model
    from asr_grpo.models.critic import ValueModel
    from asr_grpo.models.kv_batch import KVBatch, causal_lm_forward
    from asr_grpo.rollout.sampling import sample_tokens

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)   # one core, as the project's rollout engine decodes on CPU
    args.repeats = args.repeats or (5 if cuda else 2)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    shape_name = args.shape or ("qwen3_asr_1p7b" if cuda else "tiny_qwen3_asr")
    shape = OmegaConf.load(REPO / "conf" / "forecast_model" / f"{shape_name}.yaml")
    rows_grid = [int(r) for r in args.rows.split(",")] if args.rows else \
        ([1, 2, 4, 8, 16, 32, 64, 128, 256] if cuda else [1, 4, 16])
    contexts = [int(c) for c in args.contexts.split(",")] if args.contexts else [args.context or (128 if cuda else 32)]
    context = contexts[0]
    torch.manual_seed(0)
    t_build = time.perf_counter()
    tok = ShapeTokenizer(int(shape.vocab))
    with torch.device(device):
        model = build_model(model_config(shape), tok, seed=0)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"built {shape_name} ({params / 1e9:.3f}B params, {model.dtype}) on {device} in "
          f"{time.perf_counter() - t_build:.1f} s", flush=True)
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, int(shape.vocab) - 8, (n,), generator=gen).tolist()  # noqa: E731
    forward = causal_lm_forward(model)
    pad = tok.pad_token_id

    # ---- decode rounds ------------------------------------------------------------------------
    rounds = 8 if cuda else 2
    def decode_rounds(kv: KVBatch, uids: list[str], first: int, count: int) -> None:
        """`count` engine rounds: sample one token per row from the last logits, extend the cache."""
        for j in range(count):
            toks, _ = sample_tokens(kv.last, 1.0, 1.0, 0, uids=uids, positions=[first + j] * len(uids))
            kv.extend([[int(t)] for t in toks.tolist()])

    by_context = {}
    for ctx in contexts:
        decode = by_context[str(ctx)] = {}
        for rows in rows_grid:
            batch = KVBatch(forward, pad)
            names = [f"r#{i}" for i in range(rows)]
            with torch.no_grad():
                batch.prefill([ids(ctx) for _ in range(rows)], [0] * rows)
                decode_rounds(batch, names, ctx, rounds)   # warm-up
                sync()
                t0 = time.perf_counter()
                decode_rounds(batch, names, ctx + rounds, rounds)
                sync()
            decode[str(rows)] = (time.perf_counter() - t0) / rounds
            print(f"decode round at {rows:4d} rows, context {ctx}: {1e3 * decode[str(rows)]:.2f} ms", flush=True)
            del batch
    decode = by_context[str(context)]

    # ---- forward calls and prefill ------------------------------------------------------------
    with torch.no_grad():
        call_s = timed(lambda: KVBatch(forward, pad).prefill([ids(16)], [0]), args.repeats, sync)
        pr, pl = (16, 512) if cuda else (4, 64)
        batch = [ids(pl) for _ in range(pr)]
        prefill_s = timed(lambda: KVBatch(forward, pad).prefill(batch, [0] * pr), args.repeats, sync)
    print(f"forward call {1e3 * call_s:.2f} ms; prefill {pr * pl / prefill_s:.0f} tokens/s", flush=True)

    # ---- training -------------------------------------------------------------------------------
    tb, tl = (8, 512) if cuda else (4, 48)
    x = torch.tensor([ids(tl) for _ in range(tb)], device=device)
    mask = torch.ones_like(x)
    for p in model.model.audio_tower.parameters():
        p.requires_grad_(False)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-6)

    def actor_fb():
        loss = model(input_ids=x, attention_mask=mask, labels=x).loss
        loss.backward()

    actor_s = timed(actor_fb, max(2, args.repeats // 2), sync)
    opt_s = timed(opt.step, max(2, args.repeats // 2), sync)
    opt.zero_grad(set_to_none=True)
    critic = ValueModel(model.model, int(shape.hidden)).to(device=device, dtype=model.dtype)

    def critic_fb():
        critic(input_ids=x, attention_mask=mask).float().pow(2).mean().backward()

    critic_s = timed(critic_fb, max(2, args.repeats // 2), sync)
    model.zero_grad(set_to_none=True)
    print(f"training: actor {tb * tl / actor_s:.0f} tokens/s, critic {tb * tl / critic_s:.0f} tokens/s, "
          f"optimizer step {1e3 * opt_s:.1f} ms", flush=True)

    # ---- weight sync ----------------------------------------------------------------------------
    with torch.no_grad():
        copies = [torch.empty_like(p) for p in trainable]
        sync_s = timed(lambda: torch._foreach_copy_(copies, [p.detach() for p in trainable]), args.repeats, sync)
    print(f"weight sync (device copy of {sum(p.numel() for p in trainable) / 1e9:.3f}B weights): "
          f"{1e3 * sync_s:.2f} ms", flush=True)

    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    table = {"format": FORMAT, "device": name, "gpus": 1, "dtype": str(model.dtype).replace("torch.", ""),
             "model": {**OmegaConf.to_container(shape, resolve=True), "params_built": params},
             "decode_round_s": decode, "decode_context_tokens": context, "decode_round_s_by_context": by_context,
             "forward_call_s": call_s, "prefill_tokens_per_s": pr * pl / prefill_s,
             "train_tokens_per_s": {"actor": tb * tl / actor_s, "critic": tb * tl / critic_s},
             "train_step_fixed_s": opt_s, "weight_sync_s": sync_s,
             "measured": {"torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "rounds_per_point": rounds, "train_batch": [tb, tl], "prefill_batch": [pr, pl]}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
