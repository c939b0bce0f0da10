#!/usr/bin/env bash
# rollout=vllm next to rollout=hf on CPU, in the vLLM CPU venv (docs/gpu-and-vllm.md,
# "vLLM on CPU"): the same GRPO run (overlap=oppo, colocated, the default SFT checkpoint
# and seed) with each engine, the vLLM one checking the weight sync after every update;
# held-out CER every 5 steps, step times and the sync gap in MLflow; then the compare
# report of the two runs (median step, wall time, final CER, utilization) and each
# run's phase medians.
#
#   PY=.venv-vllm/bin/python bash bench/cpu_vllm.sh [OUT_DIR] [STEPS]
#
# PY: the vLLM venv's python (default .venv-vllm/bin/python). OUT_DIR (default
# bench/results/cpu_2core_vllm) gets report.md, runs.csv and phases.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv-vllm/bin/python}
OUT=${1:-bench/results/cpu_2core_vllm}
STEPS=${2:-20}
EXPERIMENT="vllm-vs-hf-$(date +%Y%m%d-%H%M%S)"
# vLLM's Qwen3-ASR imports torchvision, which the CPU build cannot load: the test-harness stub.
export PYTHONPATH="$PWD/tests/harness/torchvision_stub${PYTHONPATH:+:$PYTHONPATH}"
COMMON=(overlap=oppo placement=colocate placement.actor_gpus=0.5 placement.rollout_gpus=0.4 "trainer.steps=$STEPS"
        trainer.eval_every=5 trainer.save_every=0 rollout.sync_check_every=1 "logger.experiment_name=$EXPERIMENT")
for engine in vllm hf; do
  "$PY" -m asr_grpo.run "rollout=$engine" "${COMMON[@]}"
done
mkdir -p "$OUT"
"$PY" -m asr_grpo.compare "experiment_name=$EXPERIMENT" "output_dir=$OUT/report" register_best=false
cp "$OUT/report/report.md" "$OUT/report/runs.csv" "$OUT/"
"$PY" bench/run_phases.py --experiment "$EXPERIMENT" --out "$OUT/phases.json"
rm -rf "$OUT/report"
