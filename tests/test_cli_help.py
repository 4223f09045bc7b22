"""Every option and argument of every command line says what it does, and every CLI tells its version."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

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


def _commands(command: object, path: list[str]) -> list[tuple[list[str], object]]:
    """``(path below the program, command)`` of every leaf command."""
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        return [(path, command)]
    return [leaf for name, sub in subcommands.items() for leaf in _commands(sub, [*path, name])]


def _arguments(command: object) -> list[object]:
    return [p for p in command.params if getattr(p, "param_type_name", "") == "argument"]  # type: ignore[attr-defined]


APPS = [("clip-train", train_app), ("model-store", store_app)]


@pytest.mark.parametrize(("name", "app"), APPS)
def test_every_option_has_help(name: str, app: object) -> None:
    assert _options_without_help(get_command(app), [name]) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "app"), APPS)
def test_every_argument_has_help(name: str, app: object) -> None:
    missing = [
        f"{name} {' '.join(path)} {arg.name}"  # type: ignore[attr-defined]
        for path, command in _commands(get_command(app), [])  # type: ignore[arg-type]
        for arg in _arguments(command)
        if not getattr(arg, "help", None)
    ]
    assert missing == []


@pytest.mark.parametrize(("name", "app"), APPS)
def test_help_of_every_command_shows_its_arguments_help(name: str, app: object) -> None:
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    checked = 0
    for path, command in _commands(get_command(app), []):  # type: ignore[arg-type]
        result = runner.invoke(app, [*path, "--help"])  # type: ignore[arg-type]
        assert result.exit_code == 0, (path, result.output)
        text = " ".join(result.output.split())
        for arg in _arguments(command):
            words = " ".join(str(getattr(arg, "help", "") or "<no help>").split()[:4])
            assert words in text, f"{name} {' '.join(path)} --help: no help for {arg.name}"  # type: ignore[attr-defined]
            checked += 1
    assert checked > 5  # the commands were found


def test_python_m_service_flags_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--host", "--port", "--store", "--model", "--redis-url", "--device", "--log-level", "--version"):
        assert flag in text


@pytest.mark.parametrize(
    "cmd", [["-m", "training.cli", "--version"], ["-m", "model_store.cli", "--version"], ["-m", "service", "--version"]]
)
@pytest.mark.slow
def test_every_cli_prints_its_version(cmd: list[str]) -> None:
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == version("clip-difference-service")


@pytest.mark.parametrize(
    ("program", "module"),
    [("clip-train", "training.cli"), ("clip-train show-eval", "training.report"), ("model-store", "model_store.cli")],
)
def test_a_cli_loads_torch_only_for_the_commands_that_run_models(program: str, module: str) -> None:
    """`--help`, `--version`, `data validate` and `show-eval` answer at once: each command imports
    torch, numpy and open_clip when it runs a model, not when the program starts."""
    probe = f"import sys, {module}; print(' '.join(m for m in ('torch', 'numpy', 'open_clip') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{program} loads {proc.stdout.strip()} at start"
