# Settings the launch scripts share, from the environment (defaults: one machine, loopback).
# Sourced, not run.
PYTHON=${PYTHON:-python}                 # the project's venv python (same path on every node)
NODE_IP=${NODE_IP:-127.0.0.1}            # this node's address; on a cluster its own IP
HEAD_IP=${HEAD_IP:-127.0.0.1}            # the head's address
RAY_PORT=${RAY_PORT:-6379}               # the head's GCS port
DASHBOARD_HOST=${DASHBOARD_HOST:-127.0.0.1}   # where the dashboard and job server listen
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
# Ray's token authentication: every node and client presents the head's token
# (~/.ray/auth_token, made by the first head start, or RAY_AUTH_TOKEN); on a cluster copy
# that file to each node. RAY_AUTH_MODE=disabled turns it off (then anyone who can reach
# the ports can run code on the cluster).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
# How long a raylet waits for its node's Python agents to come up before it aborts; a busy
# machine can need more than Ray's default.
export RAY_raylet_start_wait_time_s=${RAY_raylet_start_wait_time_s:-300}
# `ray`, kept on the loopback when NODE_IP is 127.0.0.1 (see asr_grpo/distributed/ray_node.py).
RAY=("$PYTHON" -m asr_grpo.distributed.ray_node)

# Options of `ray start` shared by head and workers, from optional variables:
#   NUM_CPUS, NUM_GPUS (a CPU-only node may declare logical GPUs: the placement groups
#   then work as on GPU nodes), RAY_TEMP_DIR, and ports for several nodes on one host:
#   NODE_MANAGER_PORT OBJECT_MANAGER_PORT DASHBOARD_AGENT_PORT DASHBOARD_AGENT_GRPC_PORT
#   METRICS_PORT RUNTIME_ENV_AGENT_PORT. BLOCK=1: stay in the foreground; SIGTERM then
#   stops exactly this node's Ray processes (Slurm steps, tests).
node_args() {
  NODE_ARGS=(--node-ip-address="$NODE_IP")
  [[ -n "${NUM_CPUS:-}" ]] && NODE_ARGS+=(--num-cpus="$NUM_CPUS")
  [[ -n "${NUM_GPUS:-}" ]] && NODE_ARGS+=(--num-gpus="$NUM_GPUS")
  [[ -n "${RAY_TEMP_DIR:-}" ]] && NODE_ARGS+=(--temp-dir="$RAY_TEMP_DIR")
  [[ -n "${NODE_MANAGER_PORT:-}" ]] && NODE_ARGS+=(--node-manager-port="$NODE_MANAGER_PORT")
  [[ -n "${OBJECT_MANAGER_PORT:-}" ]] && NODE_ARGS+=(--object-manager-port="$OBJECT_MANAGER_PORT")
  [[ -n "${DASHBOARD_AGENT_PORT:-}" ]] && NODE_ARGS+=(--dashboard-agent-listen-port="$DASHBOARD_AGENT_PORT")
  [[ -n "${DASHBOARD_AGENT_GRPC_PORT:-}" ]] && NODE_ARGS+=(--dashboard-agent-grpc-port="$DASHBOARD_AGENT_GRPC_PORT")
  [[ -n "${METRICS_PORT:-}" ]] && NODE_ARGS+=(--metrics-export-port="$METRICS_PORT")
  [[ -n "${RUNTIME_ENV_AGENT_PORT:-}" ]] && NODE_ARGS+=(--runtime-env-agent-port="$RUNTIME_ENV_AGENT_PORT")
  [[ "${BLOCK:-0}" == 1 ]] && NODE_ARGS+=(--block)
  return 0
}
