#!/usr/bin/env bash
# Create .venv (if missing) and install the project, the client SDK and the given extras.
# Usage: scripts/install.sh [extras]   e.g. scripts/install.sh dev
# The install is editable, so code changes need no reinstall: it is skipped when .venv was already
# installed from the same dependency lists with the same extras (a stamp in .venv records them).
set -euo pipefail
cd "$(dirname "$0")/.."
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
stamp=".venv/.install-stamp"
wanted="$spec $(cat pyproject.toml clients/python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && grep -qxF "$wanted" "$stamp"; then
  exit 0  # installed from these dependency lists already
fi
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Python 3.11 is required")'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e "$spec" -e "clients/python[bulk]"
echo "$wanted" >>"$stamp"
