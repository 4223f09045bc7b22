#!/usr/bin/env bash
# Install everything the tests need (Redis server, the project with its dev extras, the SDK)
# and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the suite runs: redis-server (the embedding cache) and qemu-user (runs the int8
# graphs on an emulated AVX2-only CPU, whatever CPU this is). Installed when missing.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v qemu-x86_64 >/dev/null || missing+=(qemu-user)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "install these Debian packages first: ${missing[*]}" >&2
    exit 1
  fi
fi
bash scripts/install.sh dev
exec .venv/bin/python -m pytest -q "$@"
