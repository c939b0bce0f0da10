#!/usr/bin/env bash
# Join this machine to the cluster as a worker node.
#   HEAD_IP=10.0.0.1 NODE_IP=10.0.0.2 NUM_GPUS=8 launch/start_worker.sh
# On the head's own machine (a local two-node trial) give it ports of its own
# (DASHBOARD_AGENT_PORT, METRICS_PORT, ...: see launch/common.sh).
set -euo pipefail
source "$(dirname "$0")/common.sh"
node_args
echo "ray worker $NODE_IP joining $HEAD_IP:$RAY_PORT" >&2
exec "${RAY[@]}" start --address="$HEAD_IP:$RAY_PORT" "${NODE_ARGS[@]}"
