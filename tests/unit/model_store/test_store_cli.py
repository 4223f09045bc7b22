"""The ``model-store`` CLI through typer's test runner against a real registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Root
from model_store_helpers import manifest_fields, publish_evaluated, publish_simple
from typer.testing import CliRunner

from model_store import ModelStore
from model_store.cli import app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture
def populated(store: ModelStore) -> ModelStore:
    publish_evaluated(store, b"one", aliases=["production"])
    publish_evaluated(store, b"two", aliases=["staging"])
    return store


def _run(runner: CliRunner, root: Root, *args: str):  # type: ignore[no-untyped-def]
    # The weights here are placeholder bytes: the load check is exercised in tests/unit/test_import_validate.py.
    return runner.invoke(app, ["--store", root.location, "--no-load-check", *args])


def test_list_models_and_versions(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    result = _run(runner, root, "list")
    assert result.exit_code == 0, result.output
    assert "clip" in result.output and "v1, v2" in result.output
    assert "production=v1" in result.output and "staging=v2" in result.output

    result = _run(runner, root, "list", "clip")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if " v1 " in line or " v2 " in line]
    assert len(lines) == 2 and "production" in lines[0] and "staging" in lines[1]


@pytest.mark.parametrize("variable", ["CLIP_STORE", "MODEL_STORE"])  # MODEL_STORE: the deprecated alias
def test_store_from_environment(runner: CliRunner, root: Root, populated: ModelStore, variable: str) -> None:
    result = runner.invoke(app, ["list"], env={variable: root.location, "COLUMNS": "200"})
    assert result.exit_code == 0 and "production=v1" in result.output


def test_clip_store_wins_over_the_deprecated_name(
    runner: CliRunner, root: Root, populated: ModelStore, tmp_path: Path
) -> None:
    env = {"CLIP_STORE": root.location, "MODEL_STORE": str(tmp_path / "elsewhere"), "COLUMNS": "200"}
    result = runner.invoke(app, ["list"], env=env)
    assert result.exit_code == 0 and "production=v1" in result.output


def test_show_summary_metrics_and_annex(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    result = _run(runner, root, "show", "clip")
    assert result.exit_code == 0, result.output
    expected = ["clip@v1", "production", "ViT-B-32", "model.safetensors", "zero_shot_top1", "0.6100", "eval.json"]
    assert [text for text in expected if text not in result.output] == []

    result = _run(runner, root, "show", "clip@staging", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["version"] == "v2"


def test_verify_ok_and_corrupt(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    result = _run(runner, root, "verify", "clip@v1")
    assert result.exit_code == 0 and "ok" in result.output

    root.write("clip/versions/v1/model.safetensors", b"corrupt")
    result = _run(runner, root, "verify", "clip")
    assert result.exit_code == 1
    assert "error:" in result.output and "model.safetensors" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_promote_and_rollback(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    result = _run(runner, root, "promote", "clip@v2", "--alias", "production")
    assert result.exit_code == 0, result.output
    assert "v1 -> v2" in result.output
    assert populated.alias_target("clip", "production") == "v2"

    result = _run(runner, root, "rollback", "clip", "--alias", "production")
    assert result.exit_code == 0, result.output
    assert "v2 -> v1" in result.output
    assert populated.alias_target("clip", "production") == "v1"

    result = _run(runner, root, "rollback", "clip")
    assert result.exit_code == 1 and "no previous version" in result.output


def test_promote_requires_explicit_version(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    result = _run(runner, root, "promote", "clip", "--alias", "staging")
    assert result.exit_code == 1 and "name@version" in result.output


def test_gc_dry_run_and_keep(runner: CliRunner, root: Root, populated: ModelStore) -> None:
    publish_simple(populated, b"three")
    result = _run(runner, root, "gc", "clip", "--dry-run")
    assert result.exit_code == 0 and "would remove: v3" in result.output
    assert populated.list_versions("clip") == ["v1", "v2", "v3"]

    result = _run(runner, root, "gc", "clip", "--keep", "1")
    assert result.exit_code == 0 and "nothing to remove" in result.output
    result = _run(runner, root, "gc", "clip")
    assert result.exit_code == 0 and "removed: v3" in result.output
    assert populated.list_versions("clip") == ["v1", "v2"]
    result = _run(runner, root, "gc", "clip", "--staging-grace", "-1")
    assert result.exit_code == 2 and "staging-grace" in result.output


def test_publish_directory(runner: CliRunner, root: Root, tmp_path: Path) -> None:
    src = tmp_path / "export"
    (src / "onnx").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"weights")
    (src / "onnx" / "visual.onnx").write_bytes(b"onnx")
    (src / "manifest.json").write_text("{}")  # ignored: publish writes its own
    fields_file = tmp_path / "fields.json"
    fields_file.write_text(json.dumps(manifest_fields()))

    result = _run(runner, root, "publish", "clip", str(src), "--manifest-json", str(fields_file), "--alias", "staging")
    assert result.exit_code == 0, result.output
    # One line per step, so an interrupted run's output says what it left.
    staged, published, gate, alias = result.output.splitlines()
    assert staged.startswith("staged clip (2 files, 11 bytes) in clip/.staging-")
    assert published == "published clip@v1 (2 files, 11 bytes)"
    assert gate == "warning: gate: first target of the alias: not gated"
    assert alias == "alias staging -> v1"
    store = root.store()
    assert sorted(store.manifest("clip", "v1").files) == ["model.safetensors", "onnx/visual.onnx"]
    assert store.aliases("clip") == {"staging": "v1"}

    result = _run(runner, root, "publish", "clip", str(src), "--manifest-json", str(fields_file), "--version", "v1")
    assert result.exit_code == 1 and "already exists" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["show", "missing"],
        ["show", "clip@v9"],
        ["verify", "../etc"],
        ["gc", "missing"],
        ["promote", "clip@v9", "--alias", "production"],
    ],
)
def test_errors_exit_non_zero_without_traceback(
    runner: CliRunner, root: Root, populated: ModelStore, args: list[str]
) -> None:
    result = _run(runner, root, *args)
    assert result.exit_code == 1
    assert result.output.startswith("error:") and "Traceback" not in result.output


def test_list_empty_store(runner: CliRunner, root: Root) -> None:
    if not root.location.startswith("s3://"):
        Path(root.location).mkdir(parents=True, exist_ok=True)  # an empty directory, not a missing one
    result = runner.invoke(app, ["--store", root.location, "list"])
    assert result.exit_code == 0 and "no models in" in result.output


@pytest.mark.parametrize("args", [["list"], ["show", "clip"], ["verify", "clip"], ["gc", "clip"]])
def test_a_store_that_does_not_exist_is_an_error(runner: CliRunner, tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "nonexistent"
    result = runner.invoke(app, ["--store", str(missing), *args])
    assert result.exit_code == 1, result.output
    assert f"no model store at {missing}" in result.output and "CLIP_STORE" in result.output
    assert not missing.exists()  # reading never creates it
