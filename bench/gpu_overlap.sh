#!/usr/bin/env bash
# The OPPO overlap study on one CUDA GPU with the default rollout engine (the actor's own
# forward): every role on the GPU (actor 0.75 of it, reference / critic / reward model
# sharing the rest), NCCL as DeepSpeed's backend. Per workload, overlap=none and =oppo run
# side by side from the same SFT checkpoint and seed (bench/overlap_speedup.py).
#
#   bash bench/gpu_overlap.sh [OUT_DIR] [STEPS]        # default bench/results/gpu, 6 steps
#
# Writes OUT_DIR/env.txt (GPU, versions), OUT_DIR/<workload>.log and
# OUT_DIR/<workload>/overlap_speedup.{json,md}. Each workload is capped at
# WORKLOAD_TIMEOUT seconds (default 300) so one slow workload cannot eat the others.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/gpu}
steps=${2:-6}
mkdir -p "$out"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 - <<'EOF'
import deepspeed, ray, torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), "
      f"transformers {transformers.__version__}, deepspeed {deepspeed.__version__}, ray {ray.__version__}")
EOF
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
for workload in ${WORKLOADS:-default paper}; do
    timeout "${WORKLOAD_TIMEOUT:-300}" python3 bench/overlap_speedup.py --workloads "$workload" \
        --modes none oppo --steps "$steps" --out "$out/$workload" \
        placement.gpus_per_node=1 >"$out/$workload.log" 2>&1
    echo "$workload: exit $? (log: $out/$workload.log)"
    tail -n 8 "$out/$workload.log"
done
