"""How the ``model-store`` command line shows alias entries, gate reports and alias history."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from model_store.aliases import AliasEntry, AliasEvent
from model_store.gate import GateReport, GateRow

_VERDICT_STYLE = {"ok": "green", "regressed": "red", "missing": "red", "skipped": "dim", "below minimum": "red"}


def percent(value: float) -> str:
    return f"{value:g} %"


def entry_text(entry: AliasEntry) -> str:
    """``v6``, or ``v6 90 % + canary v7 10 %``, with ``, shadow v8 on 20 %`` when one runs."""
    text = entry.version
    if entry.canary is not None:
        weights = entry.weights()
        text = f"{entry.version} {percent(weights[entry.version])} + canary {entry.canary.version} " + percent(
            entry.canary.weight
        )
    if entry.shadow is not None:
        text += f", shadow {entry.shadow.version} on {percent(entry.shadow.fraction * 100)}"
    return text


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(value) else f"{value:.4f}"


def _row_cells(row: GateRow) -> list[str]:
    tolerance = "-" if row.tolerance is None else f"{row.tolerance:.4f}"
    direction = " (lower is better)" if row.direction == "lower" else ""
    style = _VERDICT_STYLE[row.verdict]
    basis = f" ({escape(row.basis)})" if row.basis else ""
    return [
        escape(row.figure) + direction,
        _figure(row.current),
        _figure(row.candidate),
        tolerance,
        f"[{style}]{row.verdict}[/{style}]{basis}",
    ]


def print_gate(out: Console, report: GateReport, all_figures: bool = False) -> None:
    """The figures that decided (every figure with ``all_figures``), then one summary line."""
    failing = ("regressed", "missing", "below minimum")
    rows = report.rows if all_figures else [r for r in report.rows if r.verdict in failing]
    if rows:
        table = Table(
            "figure", "current", "candidate", "tolerance", "verdict",
            title=f"evaluation gate: {report.candidate} against {report.against}",
        )  # fmt: skip
        for row in rows:
            table.add_row(*_row_cells(row))
        out.print(table)
    hidden = len(report.rows) - len(rows)
    more = " (--all-figures lists every figure)" if hidden and not all_figures else ""
    if not report.passed:
        out.print(f"[red]{escape(report.summary())}[/red]{more}")
    elif not report.gated:  # the summary is the note: why nothing was compared
        out.print(f"[yellow]warning: {escape(report.summary())}[/yellow]")
    else:
        out.print(f"[green]{escape(report.summary())}[/green]{more}")
        if report.note:
            out.print(f"[yellow]warning: {escape(report.note)}[/yellow]")


def gate_warning(report: GateReport) -> str | None:
    """One plain line for a gate that passed with something to say (None when it has nothing)."""
    if not report.passed or not report.note:
        return None
    return f"warning: {report.summary()}" if not report.gated else f"warning: {report.note}"


def _gate_cell(event: AliasEvent) -> str:
    """Short: the names of the failing figures are in ``history --json``."""
    gate = event.gate
    if gate is None:
        return "-"
    if gate.result == "not gated":
        if not gate.note:
            return "not gated"
        return f"[yellow]{escape(gate.note if 'not gated' in gate.note else f'not gated: {gate.note}')}[/yellow]"
    if gate.result == "pass":
        note = f" [yellow]{escape(gate.note)}[/yellow]" if gate.note else ""
        return f"pass vs {gate.against} ({gate.compared}){note}"
    failed = [f"{gate.regressed_total} regressed"] if gate.regressed_total else []
    failed += [f"{gate.missing_total} missing"] if gate.missing_total else []
    failed += [f"{len(gate.below_minimum)} below minimum"] if gate.below_minimum else []
    return f"[red]fail[/red] vs {gate.against}: {', '.join(failed) or escape(gate.note or '')}"


def _move_cell(event: AliasEvent) -> str:
    move = f"{event.from_ or '-'} -> {event.to or '-'}"
    if event.weights:
        move += " (" + ", ".join(f"{v} {percent(w)}" for v, w in event.weights.items()) + ")"
    elif event.fraction is not None:
        move += f" (on {percent(event.fraction * 100)})"
    return move


def history_table(log: dict[str, list[AliasEvent]], name: str) -> Table:
    table = Table("at (UTC)", "alias", "action", "move", "gate", "reason", "actor", title=name)
    for alias, events in sorted(log.items()):
        for event in events:
            action = f"[yellow]{event.action} (forced)[/yellow]" if event.forced else event.action
            table.add_row(
                event.at or "?", alias, action, _move_cell(event), _gate_cell(event), escape(event.reason or ""),
                escape(event.actor or ""),
            )  # fmt: skip
    return table
