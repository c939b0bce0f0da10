#!/usr/bin/env bash
# The default GRPO experiment (experiment=grpo_45min: 16 samples a prompt, 8 trained, up to 44
# minutes; held-out CER on 200 dev
# and 200 held-out-voice utterances every 50 steps) on several seeds, one after another,
# then the quality table from their MLflow runs: CER at step 0 and as the mean of the last
# three evaluations inside 45 minutes, overall, per language and on unseen voices, and
# the reward's components early and late.
#
#   bash bench/rl_quality.sh [OUT_DIR] [SEED ...]          (default: bench/results/cpu_2core_rl_quality 0 1 2)
#   OVERRIDES="algorithm.temperature=1.0" bash bench/rl_quality.sh ...   # a variant of the recipe
#   KEEP=OUT_DIR/quality.json bash bench/rl_quality.sh OUT_DIR 1   # add a seed to a table whose runs
#                                                    # this MLflow store no longer holds
#
# OUT_DIR gets quality.md, quality.json and cer_minutes.png (CER against minutes, mean and
# spread over seeds). About 45 minutes a seed on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-bench/results/cpu_2core_rl_quality}
shift || true
SEEDS=("$@")
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0 1 2)
EXPERIMENT=${EXPERIMENT:-"rl-quality-$(date +%Y%m%d-%H%M%S)"}
read -r -a EXTRA <<< "${OVERRIDES:-}"
for seed in "${SEEDS[@]}"; do
  "$PY" -m asr_grpo.run experiment=grpo_45min overlap=none placement=colocate "seed=$seed" \
      "logger.experiment_name=$EXPERIMENT" "${EXTRA[@]}"
done
mkdir -p "$OUT"
"$PY" bench/rl_quality.py --experiment "$EXPERIMENT" --out "$OUT/quality.json" --plot "$OUT/cer_minutes.png" \
    ${KEEP:+--keep "$KEEP"} > "$OUT/quality.md"
cat "$OUT/quality.md"
