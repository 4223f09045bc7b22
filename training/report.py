"""Markdown tables of evaluation results (printed by the CLI, pasted into docs)."""

from __future__ import annotations

from collections.abc import Mapping


def _cell(metrics: Mapping[str, float], key: str) -> str:
    if key not in metrics:
        return "-"
    err = metrics.get(f"{key}.stderr")
    return f"{metrics[key]:.3f}" + (f" ± {err:.3f}" if err is not None else "")


def metrics_table(metrics: Mapping[str, float], encoders: list[str]) -> str:
    """One row per metric, one column per text encoder; encoder-free keys in their own rows."""
    rows: dict[str, None] = {}
    plain: list[str] = []
    for key in metrics:
        if key.endswith(".stderr"):
            continue
        head, _, rest = key.partition(".")
        if head in encoders:
            rows.setdefault(rest)
        else:
            plain.append(key)
    lines = ["| metric | " + " | ".join(encoders) + " |", "|---|" + "---|" * len(encoders)]
    for rest in rows:
        lines.append(f"| {rest} | " + " | ".join(_cell(metrics, f"{e}.{rest}") for e in encoders) + " |")
    for key in plain:
        lines.append(f"| {key} | {_cell(metrics, key)} |" + " |" * (len(encoders) - 1))
    return "\n".join(lines)


def sweep_table(sweep: list[Mapping[str, object]]) -> str:
    lines = ["| alpha | symmetric | gate | confused (test) | overall (test) |", "|---|---|---|---|---|"]
    for r in sweep:
        lines.append(f"| {r['alpha']} | {r['symmetric']} | {r['gate']} | {r['confused']:.3f} | {r['overall']:.3f} |")
    return "\n".join(lines)
