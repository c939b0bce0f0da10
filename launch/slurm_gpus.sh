# GPUs per node of a Slurm job, read from the job's environment. Sourced, not run
# (launch/slurm_ray.sbatch; tests/workflow/test_slurm_gpus.py runs it with bash).
#
# slurm_gpus_per_node: prints the count and returns 0, or prints nothing and returns 1
# when the environment does not say (2: it says something unreadable). In order:
#   SLURM_GPUS_PER_NODE  --gpus-per-node=[type:]N; several types comma-separated (a100:4,v100:2 -> 6)
#   SLURM_GPUS_ON_NODE   the GPUs allocated on this node (also set for --gres=gpu:N)
#   SLURM_JOB_GPUS       the GPU ids of the job (0,1,2,3 or 0-3)
#   CUDA_VISIBLE_DEVICES the devices this step sees (ids or GPU-<uuid>)
slurm_gpus_per_node() {
  local item n total=0
  local -a items
  if [[ -n "${SLURM_GPUS_PER_NODE:-}" ]]; then
    IFS=',' read -ra items <<< "$SLURM_GPUS_PER_NODE"
    for item in "${items[@]}"; do
      n=${item##*:}   # type:N (or gpu:type:N) -> N
      if [[ ! "$n" =~ ^[0-9]+$ ]]; then
        echo "slurm_gpus_per_node: cannot read SLURM_GPUS_PER_NODE=$SLURM_GPUS_PER_NODE" >&2
        return 2
      fi
      total=$((total + 10#$n))
    done
    echo "$total"
    return 0
  fi
  if [[ -n "${SLURM_GPUS_ON_NODE:-}" ]]; then
    if [[ ! "$SLURM_GPUS_ON_NODE" =~ ^[0-9]+$ ]]; then
      echo "slurm_gpus_per_node: cannot read SLURM_GPUS_ON_NODE=$SLURM_GPUS_ON_NODE" >&2
      return 2
    fi
    echo "$((10#$SLURM_GPUS_ON_NODE))"
    return 0
  fi
  local spec
  for spec in "${SLURM_JOB_GPUS:-}" "${CUDA_VISIBLE_DEVICES:-}"; do
    [[ -n "$spec" && "$spec" != "NoDevFiles" ]] || continue
    total=0
    IFS=',' read -ra items <<< "$spec"
    for item in "${items[@]}"; do
      if [[ "$item" =~ ^([0-9]+)-([0-9]+)$ ]]; then   # a range of ids (a GPU-<uuid> is one device)
        total=$((total + 10#${BASH_REMATCH[2]} - 10#${BASH_REMATCH[1]} + 1))
      elif [[ -n "$item" ]]; then
        total=$((total + 1))
      fi
    done
    echo "$total"
    return 0
  done
  return 1
}
