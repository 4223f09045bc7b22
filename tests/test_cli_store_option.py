"""``--store`` before or after the command, on both command lines, with CLIP_STORE below both."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from model_store.cli import app as store_app
from training.cli import app as train_app


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "CLIP_STORE": None, "MODEL_STORE": None})


@pytest.mark.parametrize(
    "args",
    [
        ["--no-load-check", "list", "--store", "{store}"],
        ["--no-load-check", "--store", "{store}", "list"],
        ["--no-load-check", "show", "tiny@production", "--store", "{store}"],
        ["--no-load-check", "--store", "{store}", "show", "tiny@production"],
    ],
)
def test_model_store_takes_store_before_or_after_the_command(
    runner: CliRunner, tiny_store: Path, args: list[str]
) -> None:
    result = runner.invoke(store_app, [a.format(store=tiny_store) for a in args])
    assert result.exit_code == 0, result.output
    assert "tiny" in result.output and "v1" in result.output


def test_model_store_flag_after_the_command_wins(runner: CliRunner, tiny_store: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    # after the command > before it > CLIP_STORE
    result = runner.invoke(
        store_app, ["--store", str(elsewhere), "list", "--store", str(tiny_store)], env={"CLIP_STORE": str(elsewhere)}
    )
    assert result.exit_code == 0 and "production=v1" in result.output, result.output
    result = runner.invoke(store_app, ["--store", str(tiny_store), "list"], env={"CLIP_STORE": str(elsewhere)})
    assert result.exit_code == 0 and "production=v1" in result.output, result.output
    result = runner.invoke(store_app, ["list"], env={"CLIP_STORE": str(tiny_store)})
    assert result.exit_code == 0 and "production=v1" in result.output, result.output
    result = runner.invoke(store_app, ["list", "--store", str(elsewhere)], env={"CLIP_STORE": str(tiny_store)})
    assert result.exit_code == 0 and f"no models in {elsewhere}" in result.output, result.output


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["show-eval", "tiny@production", "--store", "{store}"], {}),
        (["--store", "{store}", "show-eval", "tiny@production"], {}),
        (["show-eval", "tiny@production"], {"CLIP_STORE": "{store}"}),
        (["--store", "{store}", "show-eval", "tiny@production"], {"CLIP_STORE": "{elsewhere}"}),
        (["--store", "{elsewhere}", "show-eval", "tiny@production", "--store", "{store}"], {}),
    ],
)
def test_clip_train_takes_store_before_or_after_the_command(
    runner: CliRunner, tiny_store: Path, tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    names = {"store": tiny_store, "elsewhere": tmp_path}
    result = runner.invoke(
        train_app, [a.format(**names) for a in args], env={k: v.format(**names) for k, v in env.items()}
    )
    # The tiny version has no evaluation: the message proves the command found it in that store.
    assert "tiny@v1 has no eval.json" in result.output, result.output
