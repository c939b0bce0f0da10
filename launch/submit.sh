#!/usr/bin/env bash
# Submit an RL run (or a sweep, with -m) to the cluster as a Ray job. Arguments are the
# run's Hydra overrides:
#   launch/submit.sh overlap=oppo placement=separate placement.num_nodes=2
#   launch/submit.sh -m experiment=speedup placement.num_nodes=2
# The job runs `python -m asr_grpo.run placement.ray_address=auto paths.output_root=...`
# on the head, with this repository as its runtime-env working_dir (Ray ships it to every
# node; outputs/, .venv/ and .git/ stay behind) and src/ first on PYTHONPATH, so the
# shipped code is what runs. OUTPUT_ROOT (corpus, checkpoints, the MLflow store) must be a
# path every node sees: a shared filesystem on a cluster; default ./outputs here.
# NO_WAIT=1: return at once (follow with `ray job logs -f <id>`); JOB_ID: its name.
set -euo pipefail
source "$(dirname "$0")/common.sh"
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTPUT_ROOT=${OUTPUT_ROOT:-$REPO/outputs}
JOB_PYTHON=${JOB_PYTHON:-$(command -v "$PYTHON")}   # the head's interpreter runs the driver
runtime_env=$("$PYTHON" -c 'import json, sys; print(json.dumps({"working_dir": sys.argv[1],
    "excludes": ["outputs/", ".venv/", ".git/", "*.egg-info/", "__pycache__/"],
    "env_vars": {"PYTHONPATH": "src"}}))' "$REPO")
args=(job submit --address="http://$DASHBOARD_HOST:$DASHBOARD_PORT" --runtime-env-json="$runtime_env")
[[ -n "${JOB_ID:-}" ]] && args+=(--submission-id="$JOB_ID")
[[ "${NO_WAIT:-0}" == 1 ]] && args+=(--no-wait)
flags=() overrides=()   # Hydra's flags (-m) go before the overrides
for a in "$@"; do
  case "$a" in -m|--multirun) flags+=("$a") ;; *) overrides+=("$a") ;; esac
done
exec "${RAY[@]}" "${args[@]}" -- "$JOB_PYTHON" -m asr_grpo.run "${flags[@]}" placement.ray_address=auto \
  "paths.output_root=$OUTPUT_ROOT" "${overrides[@]}"
