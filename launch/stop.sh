#!/usr/bin/env bash
# Stop a node started without BLOCK=1. Careful: `ray stop` ends EVERY Ray process of this
# user on this machine, other people's local Ray sessions included. A node started with
# BLOCK=1 is stopped by ending its start script (SIGTERM), which touches nothing else.
set -euo pipefail
source "$(dirname "$0")/common.sh"
exec "${RAY[@]}" stop "$@"
