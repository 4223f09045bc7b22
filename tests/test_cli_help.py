"""Every option of every command line says what it does, and every CLI tells its version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.main import get_command

from model_store.cli import app as store_app
from service.__main__ import parse_args
from training.cli import app as train_app

REPO = Path(__file__).resolve().parents[1]


def _options_without_help(command: object, path: list[str]) -> list[str]:
    subcommands = getattr(command, "commands", None)
    if subcommands:
        return [m for name, sub in subcommands.items() for m in _options_without_help(sub, [*path, name])]
    return [
        f"{' '.join(path)} --{p.name}"
        for p in command.params  # type: ignore[attr-defined]
        if getattr(p, "param_type_name", "") == "option" and not p.help and p.name != "help"
    ]


@pytest.mark.parametrize(("name", "app"), [("clip-train", train_app), ("model-store", store_app)])
def test_every_option_has_help(name: str, app: object) -> None:
    assert _options_without_help(get_command(app), [name]) == []  # type: ignore[arg-type]


def test_python_m_service_flags_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--host", "--port", "--store", "--model", "--redis-url", "--device", "--log-level", "--version"):
        assert flag in text


@pytest.mark.parametrize(
    "cmd", [["-m", "training.cli", "--version"], ["-m", "model_store.cli", "--version"], ["-m", "service", "--version"]]
)
def test_every_cli_prints_its_version(cmd: list[str]) -> None:
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == version("clip-difference-service")
