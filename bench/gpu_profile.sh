#!/usr/bin/env bash
# A measured cost table for the forecast (`profile=file`), in a few minutes of device time:
#
#   bash bench/gpu_profile.sh [OUT_JSON] [SHAPE]
#
# On a CUDA machine: a Qwen3-ASR of SHAPE (default qwen3_asr_1p7b, conf/forecast_model/)
# with random weights, bf16: decode-round time at 1..256 live rows, forward call and
# prefill tokens/s, actor and critic training tokens/s, the optimizer step, weight sync.
# Without a GPU the same script runs the scaled-down tiny shape on one CPU thread (how it
# is tested). Capped at PROFILE_TIMEOUT seconds (default 280). Then:
#
#   python -m asr_grpo.forecast profile=file cost_file=OUT_JSON forecast_model=SHAPE
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu_profile.json}
shape=${2:-}
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [ -z "$shape" ]; then
    shape=$("$py" -c 'import torch; print("qwen3_asr_1p7b" if torch.cuda.is_available() else "tiny_qwen3_asr")')
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout "${PROFILE_TIMEOUT:-280}" "$py" bench/gpu_profile.py --out "$out" --shape "$shape"
echo "forecast: python -m asr_grpo.forecast profile=file cost_file=$out forecast_model=$shape"
