"""Schemathesis against the live server (real uvicorn, the tiny model, real Redis): examples,
coverage, fuzzing and stateful phases, positive and negative data, every check (``--checks all``),
a fixed number of examples per operation, seeded. Beside server errors, undocumented statuses
and answers that break the response schema, it must find no request the schema admits that the
server refuses (positive_data_acceptance) and none the schema refuses that the server serves
(negative_data_rejection).

What a schema fixed at build time cannot state (limits, the serving model's encoders and width,
whether image bytes decode, labels named elsewhere in the body) is listed, with its reasons, in
``schemathesis_hooks.py`` beside this file, which also judges each verdict by the request that
was actually sent (see its docstring)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOKS = Path(__file__).resolve().parent / "schemathesis_hooks.py"
# Per operation and phase; about 20 s for the whole run on two cores (the suite must stay short).
MAX_EXAMPLES = 60
TIMEOUT_S = 300


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_or_contract_violation(base_url: str, tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st is None:
        pytest.skip("schemathesis is not installed (it is in the dev extra)")
    cmd = [st, "run", f"{base_url}/openapi.json", "--checks", "all", "--mode", "all",
           "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", str(MAX_EXAMPLES), "--seed", "1",
           # One worker: with two, the generator itself (compiling strategies in threads) has
           # failed now and then, an error of the tool, not of the server.
           "--workers", "1", "--request-timeout", "30", "--continue-on-failure", "--no-color",
           "--report", "ndjson", "--report-ndjson-path", str(tmp_path / "events.ndjson")]  # fmt: skip
    # The hooks import the service's example image: the repository root on the path.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path, env=env)
    tail = proc.stdout[-8000:] + proc.stderr[-2000:]
    print(tail)
    assert proc.returncode == 0, tail
    summary = proc.stdout.split("SUMMARY")[-1]
    assert "passed" in summary and "Failures:" not in summary and "Errors:" not in summary, tail
    events = [json.loads(line) for line in (tmp_path / "events.ndjson").read_text().splitlines() if line.strip()]
    assert events, "no events recorded"
