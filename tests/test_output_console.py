"""Both command lines print piped output at the width it needs: no line wrapped, no cell cut at 80."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from model_store.cli_options import UNBOUNDED_WIDTH, output_console


def test_piped_output_is_laid_out_unbounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = output_console(file=out, highlight=False)
    assert not console.is_terminal and console.width == UNBOUNDED_WIDTH
    table = Table("at (UTC)", "reason")
    table.add_row("2026-11-28T01:45:22Z", "a reason long enough to need more than eighty columns " * 2)
    console.print(table)
    console.print("x" * 200)
    text = out.getvalue()
    assert "…" not in text and "2026-11-28T01:45:22Z" in text
    assert "x" * 200 in text.splitlines()


def test_columns_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert output_console(file=io.StringIO()).width == 100


def test_every_console_of_the_command_lines_lays_piped_output_out_unbounded_or_soft_wrapped() -> None:
    """A rich ``Console()`` built any other way wraps lines and cuts table cells at 80 columns in a
    file or a job's log: each one is ``output_console`` or prints with ``soft_wrap=True`` (one
    logical line, never folded), or only asks whether the output is a terminal."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    found = []
    for package in ("training", "model_store", "service", "loadtests", "scripts"):
        for path in (repo / package).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\bConsole\(", line) and "def " not in line:
                    found.append((path.relative_to(repo), number, line.strip()))
    assert found  # the scan reads the sources
    only_asks = ".is_terminal if terminal is None else terminal"
    allowed = [f for f in found if "soft_wrap=True" in f[2] or f[2].endswith(only_asks)
               or str(f[0]) == "model_store/cli_options.py"]  # fmt: skip
    assert [f for f in found if f not in allowed] == []
