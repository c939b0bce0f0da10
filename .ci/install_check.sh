#!/usr/bin/env bash
# CI: the package as a user installs it. A fresh venv (pip cache reused), torch first
# (pinned to the CPU wheel, as `make install` does), then `pip install .` of this
# repository (NOT editable: the configs must come from the installed package), and from
# an empty folder `asr-grpo-run debug=fast` end to end (tiny corpus, 6-step SFT, 2 RL
# steps; ~1 min on 2 cores). Passes when the run exits 0 and wrote its MLflow store (a
# FINISHED run) under the output root it was given, and the other console scripts
# compose their configs. KEEP=1 keeps the temp folder; PYTHON picks the interpreter.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
source "$REPO/.ci/common.sh"
ci_workdir "install check" asr-grpo-install

# A copy of the source tree (what git ships, less the ignored outputs), so the in-tree
# build's build/ and *.egg-info never land in the repository.
mkdir "$WORK/src" "$WORK/empty"
tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./build --exclude=./dist \
  --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.ruff_cache \
  --exclude=mlruns --exclude=multirun --exclude=mlflow.db -cf - . | tar -C "$WORK/src" -xf -

step "venv"
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "$TORCH"
step "pip install . (not editable)"
"$PY" -m pip install -q "$WORK/src"
rm -rf "$WORK/src"   # nothing but the installed package from here on

cd "$WORK/empty"
step "the configs come from the installed package"
"$PY" - "$WORK/venv" <<'EOF'
import sys
from pathlib import Path

import asr_grpo
from asr_grpo.config.store import CONF_DIR

venv = Path(sys.argv[1]).resolve()
pkg, conf = Path(asr_grpo.__file__).resolve(), Path(CONF_DIR)
assert venv in pkg.parents, f"asr_grpo imported from {pkg}, not the fresh venv {venv}"
assert venv in conf.parents and (conf / "config.yaml").is_file(), f"configs not in the installed package: {conf}"
print(f"asr_grpo {pkg.parent}, configs {conf} ({sum(1 for _ in conf.rglob('*.yaml'))} YAML files)")
EOF
for script in asr-grpo-sft asr-grpo-compare asr-grpo-forecast; do
  "$WORK/venv/bin/$script" --cfg job > /dev/null || { echo "install check: $script --cfg job failed" >&2; exit 1; }
done
# Outputs default to the current folder (a relative paths.output_root), not the package.
"$WORK/venv/bin/asr-grpo-run" debug=fast --cfg job --resolve | grep -q "tracking_uri: sqlite:///outputs/mlflow.db" \
  || { echo "install check: the default MLflow store is not ./outputs/mlflow.db" >&2; exit 1; }

step "asr-grpo-run debug=fast from an empty folder"
OUT="$WORK/out"
timeout "${RUN_TIMEOUT_S:-900}" "$WORK/venv/bin/asr-grpo-run" debug=fast "paths.output_root=$OUT" \
  > "$WORK/run.log" 2>&1 || { rc=$?; tail -n 60 "$WORK/run.log" >&2; echo "install check: asr-grpo-run failed (rc $rc)" >&2; exit 1; }
tail -n 3 "$WORK/run.log"

step "MLflow store under the output root"
[[ -f "$OUT/mlflow.db" ]] || { echo "install check: no MLflow store at $OUT/mlflow.db" >&2; exit 1; }
"$PY" - "$OUT" <<'EOF'
import sys

from mlflow.tracking import MlflowClient

client = MlflowClient(f"sqlite:///{sys.argv[1]}/mlflow.db")
runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
finished = [r for r in runs if r.info.status == "FINISHED" and r.data.metrics]
assert finished, f"no finished run with metrics in {sys.argv[1]}/mlflow.db: {[r.info.status for r in runs]}"
print(f"{len(finished)} finished run(s), e.g. {finished[0].info.run_name} with {len(finished[0].data.metrics)} metrics")
EOF
left=$(ls -A "$WORK/empty")
[[ -z "$left" ]] || { echo "install check: the run wrote into its cwd instead of paths.output_root: $left" >&2; exit 1; }
step "passed"
