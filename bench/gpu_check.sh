#!/usr/bin/env bash
# The GPU check in one command (docs/gpu-and-vllm.md, "The GPU check"):
#
#   bash bench/gpu_check.sh [OUT_DIR] [--steps N] [--repeats R] [--require STAGES]
#
# On a CUDA machine, under 9 minutes: Qwen3-ASR-0.6B at full size with random weights,
# its measured cost table, the roofline beside it, the forecast of none / oppo written
# before the runs, GRPO none / oppo with rollout=hf and with rollout=vllm (sync check after
# every update), placement=separate over NCCL where there are 2+ GPUs, and the forecast
# against the runs. Without CUDA (or GPU_CHECK_CPU=1) the same stages, scaled down; the
# GPU-only parts are named as skipped. Stages and files: bench/gpu_check.py's docstring.
#
# OUT_DIR: GPU bench/results/gpu_check_<gpu>, CPU <tmp>/gpu_check_cpu. Environment:
#   PYTHON                 the interpreter (default .venv/bin/python, else python3)
#   GPU_CHECK_LIMIT_S      the hard limit on the whole command (default 540 s; the stages
#                          budget themselves inside GPU_CHECK_BUDGET_S, GPU 510 s, CPU 420 s)
#   GPU_CHECK_TAR          also pack OUT_DIR into this .tar.gz after every stage
#   GPU_CHECK_WHEELS       a folder of wheels to install missing packages from (no index)
#   GPU_CHECK_VLLM_PYTHON  another interpreter (a venv with vLLM) for the vLLM stages
#   GPU_CHECK_VLLM_EAGER=1 vLLM without torch.compile and CUDA graphs (starts faster)
#   GPU_CHECK_CPU=1        the CPU dry run even where CUDA is present
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
       RAY_USAGE_STATS_ENABLED=0 HYDRA_FULL_ERROR=1
# SIGTERM at the limit (the driver marks the running stage and writes the summary), SIGKILL 20 s later.
timeout -k 20 "${GPU_CHECK_LIMIT_S:-540}" "$py" bench/gpu_check.py "$@"
rc=$?
[ "$rc" = 124 ] && echo "gpu_check: stopped at GPU_CHECK_LIMIT_S=${GPU_CHECK_LIMIT_S:-540} s; partial results kept"
exit "$rc"
