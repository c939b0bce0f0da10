#!/usr/bin/env bash
# The whole flow on one machine (or on a cluster's head, with workers joining it):
# start a Ray head, make sure the SFT checkpoint exists, submit the RL run from it as a
# Ray job, stop the head when the job ends. Arguments are the run's Hydra overrides:
#   launch/train_from_sft.sh overlap=oppo placement=colocate
#   SFT_CKPT=/shared/ckpt/sft NUM_GPUS=8 launch/train_from_sft.sh placement=separate
set -euo pipefail
source "$(dirname "$0")/common.sh"
HERE=$(dirname "$0")
REPO=$(cd "$HERE/.." && pwd)
export OUTPUT_ROOT=${OUTPUT_ROOT:-$REPO/outputs}
SFT_CKPT=${SFT_CKPT:-$OUTPUT_ROOT/checkpoints/sft-tiny}
# The same check the run makes (asr_grpo.models.checkpoint_problem), before a job is queued.
problem=$("$PYTHON" -c 'import sys; from asr_grpo.models import checkpoint_problem as p; print(p(sys.argv[1]) or "")' "$SFT_CKPT")
if [[ -n "$problem" ]]; then
  echo "no usable checkpoint at $SFT_CKPT ($problem): building it (corpus + SFT)" >&2
  "$PYTHON" -m asr_grpo.sft "paths.output_root=$OUTPUT_ROOT" "sft.output_dir=$SFT_CKPT"
fi
# On a CPU-only machine, declare logical GPUs so the placement groups schedule as on GPUs.
command -v nvidia-smi >/dev/null || export NUM_GPUS=${NUM_GPUS:-5}
BLOCK=1 "$HERE/start_head.sh" &
head_pid=$!
trap 'kill "$head_pid" 2>/dev/null; wait "$head_pid" 2>/dev/null || true' EXIT
"$HERE/wait_for_nodes.sh" 1
"$HERE/submit.sh" "model.path=$SFT_CKPT" "$@"
