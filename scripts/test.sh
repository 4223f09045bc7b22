#!/usr/bin/env bash
# Install everything the tests need (Redis server, the project with its dev extras, the SDK)
# and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is required: install it (e.g. apt-get install redis-server)" >&2
    exit 1
  fi
fi
bash scripts/install.sh dev
exec .venv/bin/python -m pytest -q "$@"
