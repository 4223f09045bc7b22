"""``model-store`` canary, shadow, gated promote, rollback, history, gate and policy end to end
through typer's test runner, on a directory and on a real S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Root
from model_store_helpers import NEGATION, default_eval, negation_fell, publish_simple, write_eval
from typer.testing import CliRunner

from model_store import ModelStore
from model_store.cli import app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture
def evaluated(store: ModelStore) -> ModelStore:
    """v1 in production with the default model's eval.json; v2 the same but its PC-CLIP negation
    figure fell; v3 as good as v1."""
    base = default_eval()
    for i, report in enumerate((base, negation_fell(base), base)):
        version = publish_simple(store, f"weights {i}".encode())
        write_eval(store, "clip", version, report)
    store.promote("clip", "production", "v1")
    return store


def _run(runner: CliRunner, root: Root, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--store", root.location, "--no-load-check", *args])


def test_gated_promote_force_history_and_rollback(runner: CliRunner, root: Root, evaluated: ModelStore) -> None:
    result = _run(runner, root, "promote", "clip", "v2")
    assert result.exit_code == 1
    table = result.stdout
    for header in ("figure", "current", "candidate", "tolerance", "verdict"):
        assert header in table
    (line,) = [row for row in table.splitlines() if NEGATION in row]
    assert "0.8996" in line and "0.7996" in line and "regressed" in line
    assert "refusing to point clip@production at v2" in result.output and "--force --reason" in result.output
    assert evaluated.alias_target("clip", "production") == "v1"

    result = _run(runner, root, "promote", "clip@v2", "--force")
    assert result.exit_code == 1 and "needs a reason" in result.output
    result = _run(runner, root, "promote", "clip@v2", "--force", "--reason", "negation traded for recall")
    assert result.exit_code == 0, result.output
    assert "v1 -> v2" in result.output and NEGATION in result.output  # the table is shown when forced too

    result = _run(runner, root, "history", "clip", "--json")
    assert result.exit_code == 0, result.output
    forced = json.loads(result.stdout)["production"][-1]
    assert forced["forced"] is True and forced["reason"] == "negation traded for recall"
    assert forced["gate"]["result"] == "fail" and forced["gate"]["regressed"] == [NEGATION]
    assert (forced["from"], forced["to"], forced["action"]) == ("v1", "v2", "promote")

    result = _run(runner, root, "rollback", "clip", "--reason", "customers saw it")
    assert result.exit_code == 0 and "clip@production: v2 -> v1" in result.output
    result = _run(runner, root, "history", "clip", "--alias", "production")
    assert result.exit_code == 0, result.output
    assert "promote (forced)" in result.output and "negation traded for recall" in result.output
    assert "fail vs v1: 1 regressed" in result.output and "customers saw it" in result.output
    assert "clip@production: v1" in result.output


@pytest.mark.slow
def test_canary_shadow_and_their_ends(runner: CliRunner, root: Root, evaluated: ModelStore) -> None:
    result = _run(runner, root, "canary", "clip", "v3", "--alias", "production", "--weight", "10")
    assert result.exit_code == 0, result.output
    assert "none regressed" in result.output and "clip@production: v1 90 % + canary v3 10 %" in result.output
    result = _run(runner, root, "canary", "clip", "v2", "--weight", "10")
    assert result.exit_code == 3 and "a canary of v3 already runs on production" in result.output
    result = _run(runner, root, "canary", "clip", "v2", "--weight", "10", "--replace")
    assert result.exit_code == 1 and NEGATION in result.stdout and "model-store canary clip v2" in result.output
    result = _run(runner, root, "canary", "clip", "v3", "--weight", "100")
    assert result.exit_code == 1 and "between 0 and 100" in result.output

    result = _run(runner, root, "shadow", "clip", "v2", "--fraction", "0.2")
    assert result.exit_code == 0 and "shadow v2 on 20 %" in result.output
    result = _run(runner, root, "shadow", "clip")
    assert result.exit_code == 1 and "--off" in result.output
    result = _run(runner, root, "shadow", "clip", "--off")
    assert result.exit_code == 0 and "(no shadow)" in result.output

    result = _run(runner, root, "rollback", "clip")
    assert result.exit_code == 0 and "canary v3 ended at 0 % -> v1" in result.output
    assert _run(runner, root, "canary", "clip", "v3", "-w", "50").exit_code == 0
    result = _run(runner, root, "promote", "clip@v3")
    assert result.exit_code == 0 and "v1 -> v3 (canary ended at 100 %)" in result.output
    entry = evaluated.alias_entry("clip", "production")
    assert entry is not None and entry.version == "v3" and entry.canary is None and entry.shadow is None

    result = _run(runner, root, "history", "clip")
    actions = ["canary-start", "canary-rollback", "shadow-start", "shadow-end", "canary-promote"]
    assert all(action in result.output for action in actions)
    assert "v1 -> v3 (v1 90 %, v3 10 %)" in result.output


@pytest.mark.slow
def test_gate_dry_run_and_policy(runner: CliRunner, root: Root, evaluated: ModelStore, tmp_path: Path) -> None:
    result = _run(runner, root, "gate", "clip", "v2")
    assert result.exit_code == 1 and NEGATION in result.output
    assert evaluated.alias_log("clip")["production"][-1].to == "v1"  # nothing moved
    result = _run(runner, root, "gate", "clip", "v3", "--all-figures")
    assert result.exit_code == 0 and "dense.localisation.chance" in result.output and "ignored" in result.output

    policy = tmp_path / "gate.json"
    policy.write_text(json.dumps({"tolerance": {NEGATION: 0.15}}))
    result = _run(runner, root, "policy", "clip", "--set", str(policy))
    assert result.exit_code == 0 and "0.15" in result.output
    assert _run(runner, root, "gate", "clip", "v2").exit_code == 0
    policy.write_text(json.dumps({"direction": {"x": "sideways"}}))
    result = _run(runner, root, "policy", "clip", "--set", str(policy))
    assert result.exit_code == 1 and "not a gate policy" in result.output
    assert _run(runner, root, "policy", "clip", "--clear").exit_code == 0
    assert _run(runner, root, "gate", "clip", "v2").exit_code == 1
    result = _run(runner, root, "gate", "clip", "v2", "--alias", "staging")
    assert result.exit_code == 0 and "first target of the alias: not gated" in result.output


def test_gate_warnings_and_the_counts_the_history_shows(runner: CliRunner, root: Root, evaluated: ModelStore) -> None:
    unevaluated = publish_simple(evaluated, b"random weights")
    result = _run(runner, root, "promote", f"clip@{unevaluated}", "--force", "--reason", "plumbing test")
    assert result.exit_code == 0, result.output
    gate = evaluated.alias_log("clip")["production"][-1].gate
    assert gate is not None and gate.missing_count is not None and gate.missing_count > 300
    missing = gate.missing_count
    result = _run(runner, root, "history", "clip", "--alias", "production")
    assert f"fail vs v1: {missing} missing" in result.output  # all of them, not the 20 names kept

    result = _run(runner, root, "promote", "clip@v3")
    assert result.exit_code == 0, result.output
    assert f"warning: gate: {unevaluated} has no eval.json: nothing to compare with; v3's evaluation is the " in (
        result.output
    )
    result = _run(runner, root, "history", "clip", "--alias", "production")
    assert f"not gated: {unevaluated} has no eval.json" in result.output


def test_tables_are_not_cut_when_the_output_is_not_a_terminal(root: Root, evaluated: ModelStore) -> None:
    """Piped output (a file, a CI log) is laid out at the width its cells need, not at 80 columns."""
    import os
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [sys.executable, "-m", "model_store.cli", "--store", root.location, "history", "clip"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout, result.stdout
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", result.stdout), result.stdout
