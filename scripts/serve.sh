#!/usr/bin/env bash
# Install and start the service on the committed default model (default@production).
# Uses a local Redis for the embedding cache when one is installed or reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh cpu
if [ -z "${CLIP_REDIS_URL:-}" ]; then
  if command -v redis-cli >/dev/null && redis-cli -p 6379 ping >/dev/null 2>&1; then
    export CLIP_REDIS_URL=redis://127.0.0.1:6379/0
  elif command -v redis-server >/dev/null; then
    redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null
    export CLIP_REDIS_URL=redis://127.0.0.1:6379/0
  else
    echo "redis-server not found: serving without the shared embedding cache" >&2
  fi
fi
exec .venv/bin/python -m service --host "${CLIP_HOST:-127.0.0.1}" --port "${CLIP_PORT:-8000}" "$@"
