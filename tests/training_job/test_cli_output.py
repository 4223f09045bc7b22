"""clip-train as a terminal user and a script see it: a missing model is one line, not a traceback;
a markdown table piped to a file keeps one row per line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def clip_train(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "training.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


@pytest.mark.slow
def test_a_model_the_store_does_not_have_is_one_line() -> None:
    proc = clip_train("show-eval", "nosuch@production", "--store", str(REPO / "models"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: model 'nosuch' not found", proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_piped_table_keeps_one_row_per_line() -> None:
    """Piped, rich assumed 80 columns and broke every row of the 84-column table."""
    proc = clip_train("show-eval", "default@production", "--store", str(REPO / "models"))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(rows) > 20 and all(line.endswith("|") for line in rows)
    assert max(len(line) for line in rows) > 80  # the case that used to break
