#!/usr/bin/env bash
# Wait until the cluster has N alive nodes (default 2), at most TIMEOUT_S seconds (120);
# then print Ray's list of them (JSON: node_id, node_ip, is_head_node, resources, ...).
#   launch/wait_for_nodes.sh 4
set -euo pipefail
source "$(dirname "$0")/common.sh"
want=${1:-2}
deadline=$((SECONDS + ${TIMEOUT_S:-120}))
while true; do
  listing=$("${RAY[@]}" list nodes --address="http://$DASHBOARD_HOST:$DASHBOARD_PORT" --filter="state=ALIVE" \
              --format=json 2>/dev/null || true)
  alive=$(printf '%s' "$listing" | "$PYTHON" -c "import json, sys
try: print(len(json.load(sys.stdin)))
except ValueError: print(0)")
  if (( alive >= want )); then
    echo "$alive nodes alive" >&2
    printf '%s\n' "$listing"
    exit 0
  fi
  if (( SECONDS >= deadline )); then
    echo "only $alive of $want nodes alive after ${TIMEOUT_S:-120} s" >&2
    exit 1
  fi
  sleep 2
done
