#!/usr/bin/env bash
# Start the Ray head on this machine.
#   launch/start_head.sh                               # a one-machine trial, loopback only
#   NODE_IP=10.0.0.1 NUM_GPUS=8 launch/start_head.sh   # the head of a cluster
# Settings: launch/common.sh. Then start workers (launch/start_worker.sh) and submit
# (launch/submit.sh). RAY_CLIENT_PORT: the Ray client server's port (default 10001).
set -euo pipefail
source "$(dirname "$0")/common.sh"
node_args
args=(start --head --port="$RAY_PORT" --include-dashboard=true
      --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$DASHBOARD_PORT")
[[ -n "${RAY_CLIENT_PORT:-}" ]] && args+=(--ray-client-server-port="$RAY_CLIENT_PORT")
echo "ray head: GCS $NODE_IP:$RAY_PORT, jobs http://$DASHBOARD_HOST:$DASHBOARD_PORT" >&2
exec "${RAY[@]}" "${args[@]}" "${NODE_ARGS[@]}"
