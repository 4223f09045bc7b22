#!/usr/bin/env bash
# Create .venv (if missing) and install the project, the client SDK and the given extras.
# Usage: scripts/install.sh [extras]   e.g. scripts/install.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Python 3.11 is required")'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
.venv/bin/python -m pip install -q -e "$spec" -e clients/python
