#!/usr/bin/env bash
# Install (when the environment is missing or its dependency lists changed) and start the service
# on the committed default model (default@production). Uses a local Redis for the embedding cache
# when one is installed or reachable (port REDIS_PORT, default 6379); a redis-server started here
# stops when the service stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh cpu
redis_pid=""
redis_port="${REDIS_PORT:-6379}"
if [ -z "${CLIP_REDIS_URL:-}" ]; then
  if command -v redis-cli >/dev/null && redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
    export CLIP_REDIS_URL="redis://127.0.0.1:$redis_port/0"
  elif command -v redis-server >/dev/null; then
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    redis_pid=$!
    export CLIP_REDIS_URL="redis://127.0.0.1:$redis_port/0"
  else
    echo "redis-server not found: serving without the shared embedding cache" >&2
  fi
fi
.venv/bin/python -m service --host "${CLIP_HOST:-127.0.0.1}" --port "${CLIP_PORT:-8000}" "$@" &
service_pid=$!
# A signal to this script reaches the service (graceful shutdown), then what was started here stops.
trap 'kill -TERM "$service_pid" 2>/dev/null || true' INT TERM
while kill -0 "$service_pid" 2>/dev/null; do
  wait "$service_pid" || true  # returns early when a trapped signal arrives: wait again
done
status=0
wait "$service_pid" || status=$?  # the service's own exit status, kept by the shell
if [ -n "$redis_pid" ]; then
  kill -TERM "$redis_pid" 2>/dev/null || true
  wait "$redis_pid" 2>/dev/null || true
fi
exit "$status"
