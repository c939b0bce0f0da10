# Sourced by the CI legs that build a venv of their own (.ci/install_check.sh,
# .ci/vllm_leg.sh): nothing inherited from the repository's venv or a Ray cluster, a temp
# folder removed at exit (KEEP=1 keeps it), DeepSpeed's JIT build kept inside it (it is
# per interpreter path: left in the default place it would replace the repository venv's
# cached build, rebuilt there next), and timed step lines.
ci_workdir() {   # $1: label for messages, $2: temp-folder prefix; sets WORK
  CI_LABEL=$1
  export PIP_DISABLE_PIP_VERSION_CHECK=1 RAY_USAGE_STATS_ENABLED=0
  unset PYTHONPATH VIRTUAL_ENV RAY_ADDRESS
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX")
  trap 'if [[ "${KEEP:-0}" == 1 ]]; then echo "$CI_LABEL: kept $WORK"; else rm -rf "$WORK"; fi' EXIT
  export TORCH_EXTENSIONS_DIR="$WORK/torch_extensions"
  CI_T0=$SECONDS
}
step() { echo "$CI_LABEL [$((SECONDS - CI_T0)) s]: $*"; }
