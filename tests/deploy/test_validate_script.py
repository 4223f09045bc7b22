"""The offline deployment validation that CI relies on: every overlay (and the bulk Job) renders,
every object is schema-valid, checkov findings are fixed or justified, and the Dockerfiles lint
clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_deploy_validate_script_passes() -> None:
    proc = subprocess.run(["bash", "deploy/validate.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "all objects valid" in proc.stdout
    assert "k8s/bulk: rendered" in proc.stdout
