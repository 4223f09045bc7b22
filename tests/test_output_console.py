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
