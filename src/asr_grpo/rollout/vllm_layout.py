"""Our Qwen3-ASR checkpoints in the layout vLLM loads.

transformers (>= 5.24) saves Qwen3-ASR flat: `audio_config` / `text_config` at the top,
weights under `model.audio_tower.`, `model.multi_modal_projector.` and
`model.language_model.`. vLLM's `Qwen3ASRForConditionalGeneration` reads the layout of
the released Qwen checkpoints: a `thinker_config` holding both sub-configs, weights
under `thinker.` (the adapter's two linears are the audio tower's `proj1`/`proj2`),
and a WhisperFeatureExtractor. `export_for_vllm` writes that copy next to the outputs
once per checkpoint; `vllm_weight_name` is the same renaming for the weight sync.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

# (our prefix, vLLM checkpoint prefix), first match wins.
_RENAMES = (
    ("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1."),
    ("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2."),
    ("model.audio_tower.", "thinker.audio_tower."),
    ("model.language_model.", "thinker.model."),
    ("lm_head.", "thinker.lm_head."),
)
# Buffers computed at construction (never in a checkpoint): vLLM builds its own.
_DERIVED = ("positional_embedding.positional_embedding", "rotary_emb.inv_freq", "rotary_emb.original_inv_freq")
_TOKENIZER_FILES = ("tokenizer.json", "chat_template.jinja", "generation_config.json", "special_tokens_map.json")
_DONE = "vllm_export.json"


def vllm_weight_name(name: str) -> str | None:
    """Our parameter/buffer name -> vLLM's checkpoint name; None for derived buffers."""
    if name.endswith(_DERIVED):
        return None
    for ours, theirs in _RENAMES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    raise ValueError(f"no vLLM name for tensor {name!r}: not a Qwen3-ASR checkpoint of transformers' layout")


def _token_id(tokenizer_json: dict, token: str) -> int:
    for added in tokenizer_json.get("added_tokens", []):
        if added["content"] == token:
            return int(added["id"])
    return int(tokenizer_json["model"]["vocab"][token])


def vllm_config(config: dict, tokenizer_json: dict) -> dict:
    """Our config.json -> the released Qwen3-ASR layout (`thinker_config`)."""
    audio = {k: v for k, v in config["audio_config"].items() if k not in ("model_type", "max_position_embeddings")}
    audio["model_type"] = "qwen3_asr_audio_encoder"
    text = dict(config["text_config"])
    rope = text.get("rope_parameters") or {}
    text.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    text["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    thinker = {"model_type": "qwen3_asr_thinker", "audio_config": audio, "text_config": text,
               "audio_token_id": int(config["audio_token_id"]),
               "audio_start_token_id": _token_id(tokenizer_json, "<|audio_start|>"),
               "user_token_id": _token_id(tokenizer_json, "<|im_start|>")}
    return {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
            "thinker_config": thinker, "dtype": config.get("dtype", "float32"),
            "torch_dtype": config.get("dtype", "float32"),
            "tie_word_embeddings": text["tie_word_embeddings"],
            "eos_token_id": config.get("eos_token_id"), "pad_token_id": config.get("pad_token_id")}


def _feature_extractor(src: Path) -> dict:
    """Our processor's feature-extractor settings as a WhisperFeatureExtractor's (the
    same log-mel front end); vLLM asserts that type even when it is handed features."""
    processor = json.loads((src / "processor_config.json").read_text())
    fe = dict(processor.get("feature_extractor", processor))
    fe["feature_extractor_type"] = "WhisperFeatureExtractor"
    fe.pop("n_window", None)
    return fe


def _export_key(src: Path) -> str:
    h = hashlib.sha256((src / "config.json").read_bytes())
    for f in sorted(src.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def export_for_vllm(src: str | Path, out_root: str | Path) -> Path:
    """Write (once; reused while the source is unchanged) the vLLM layout of the HF
    folder `src` under `out_root`; returns the folder to pass as vLLM's model."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(src)
    dst = Path(out_root) / f"{src.name}-{_export_key(src)}"
    if (dst / _DONE).exists():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}-", dir=dst.parent))
    try:
        tensors = {}
        for f in sorted(src.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for name in st.keys():
                    target = vllm_weight_name(name)
                    if target is not None:
                        tensors[target] = st.get_tensor(name).contiguous()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer_json = json.loads((src / "tokenizer.json").read_text())
        config = vllm_config(json.loads((src / "config.json").read_text()), tokenizer_json)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "preprocessor_config.json").write_text(json.dumps(_feature_extractor(src), indent=2))
        tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
        tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"   # loads tokenizer.json as it is
        tok_cfg.pop("processor_class", None)
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
        for name in _TOKENIZER_FILES:
            if (src / name).exists():
                shutil.copy2(src / name, tmp / name)
        (tmp / _DONE).write_text(json.dumps({"source": str(src.resolve()), "tensors": len(tensors)}))
        try:
            os.rename(tmp, dst)
        except OSError:   # another engine on this node exported it first
            if not (dst / _DONE).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst
