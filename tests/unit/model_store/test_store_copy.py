"""``model-store copy``: a rehearsal candidate that is the production model under another version,
on a directory and on a real S3 server. The copy holds the same files, its eval.json still counts
as its evaluation (bound to the files, not the name), no alias moves, and the gate then passes it
against its source, so a canary, a promote and a rollback can be rehearsed with it."""

from __future__ import annotations

import json

import pytest
from conftest import Root
from model_store_helpers import default_eval, publish_simple, write_eval
from typer.testing import CliRunner

from model_store import ModelStore
from model_store.cli import app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"NO_COLOR": "1"})


def _run(runner: CliRunner, root: Root, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--store", root.location, "--no-load-check", *args])


def test_a_copy_is_a_new_version_with_the_same_files_and_evaluation(
    runner: CliRunner, root: Root, store: ModelStore
) -> None:
    publish_simple(store, b"production weights")
    write_eval(store, "clip", "v1", default_eval())
    store.promote("clip", "production", "v1")

    result = _run(runner, root, "copy", "clip@production", "--as", "clip")
    assert result.exit_code == 0, result.output
    assert "published clip@v2" in result.output and "copied clip@v1 -> clip@v2 (no alias moved)" in result.output
    source, copy = store.manifest("clip", "v1"), store.manifest("clip", "v2")
    assert copy.files == source.files and copy.architecture == source.architecture
    assert copy.notes.startswith("copy of clip@v1")
    assert store.read_annex("clip", "v2", "eval.json") == store.read_annex("clip", "v1", "eval.json")
    store.verify("clip", "v2")
    assert store.aliases("clip") == {"production": "v1"}

    report = store.gate("clip", "production", "v2")
    assert report.passed and report.compared > 300 and report.note is None, report.summary()
    assert _run(runner, root, "canary", "clip", "v2", "--weight", "10").exit_code == 0
    assert _run(runner, root, "promote", "clip@v2").exit_code == 0
    assert _run(runner, root, "rollback", "clip").exit_code == 0
    assert store.aliases("clip") == {"production": "v1"}

    # Another model name and an explicit version; the name's manifest field follows the copy.
    result = _run(runner, root, "copy", "clip@v1", "--as", "rehearsal@r1")
    assert result.exit_code == 0, result.output
    assert store.manifest("rehearsal", "r1").name == "rehearsal"
    history = json.loads(_run(runner, root, "history", "clip", "--json").stdout)
    assert [e["action"] for e in history["production"]][-3:] == ["canary-start", "canary-promote", "rollback"]


def test_copy_refuses_what_it_cannot_make(runner: CliRunner, root: Root, store: ModelStore) -> None:
    publish_simple(store, b"w1")
    publish_simple(store, b"w2")
    cases = {
        ("copy", "clip@v1", "--as", "clip@v2"): "already exists",
        ("copy", "clip", "--as", "clip"): "needs name@version",
        ("copy", "clip@v9", "--as", "clip"): "no alias or version 'v9'",
        ("copy", "clip@v1", "--as", "clip@"): "--as takes NAME or NAME@VERSION",
        ("copy", "clip@v1", "--as", "../x"): "model name",
    }
    for args, message in cases.items():
        result = _run(runner, root, *args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)
    assert store.list_versions("clip") == ["v1", "v2"]
