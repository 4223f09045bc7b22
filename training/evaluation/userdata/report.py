"""The evaluation report of a version: one self-contained HTML file (plots embedded as PNG) rendered
from eval.json alone, so it can be rebuilt any time and covers every dataset evaluated.

Per dataset: a table of every figure the version's components allow, in prose with its eval.json
key and chance level (and, after ``--compare``, the compared version's figure and the change), the
confused classes, the confusion matrix before and after comparative prompting, and per-family bars
with error bars and a dashed chance line (the compared version's bars beside them). Plots need
matplotlib (the ``report`` extra); without it the report holds the tables only and says so.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.evaluation.userdata.figures import (
    cell,
    chance,
    confused_lines,
    default_encoders,
    delta,
    figures,
    relative,
)

REPORT_FILE = "report.html"


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def confusion_png(labels: list[str], before: list[list[int]], after: list[list[int]] | None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    mats = [("standard prompts", before)] + ([("with comparatives", after)] if after is not None else [])
    fig, axes = plt.subplots(1, len(mats), figsize=(5.2 * len(mats), 4.6), squeeze=False)
    for ax, (title, mat) in zip(axes[0], mats, strict=True):
        m = np.asarray(mat, dtype=float)
        rows = m / np.maximum(m.sum(1, keepdims=True), 1)
        ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        for (i, j), v in np.ndenumerate(m):
            if v:
                ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6,
                        color="white" if rows[i, j] > 0.5 else "black")  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
    return _png(fig)


def bars_png(title: str, bars: Sequence[Bar], refs: Sequence[str]) -> bytes:
    """One bar per figure and version (``refs``: the compared version first, when there is one),
    with its standard error and, where the figure has one, a dashed chance line across its bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(refs)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(3.5, (0.6 + 0.45 * n) * len(bars) + 1.5), 3.4))
    colours = ["#4c72b0", "#dd8452"] if n == 2 else ["#4c72b0"]
    for j, (ref, colour) in enumerate(zip(refs, colours, strict=False)):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(bars))]
        values = [b.values[j] for b in bars]
        ax.bar([x for x, v in zip(xs, values, strict=True) if v is not None],
               [v[0] for v in values if v is not None], width=width * 0.95,
               yerr=[v[1] for v in values if v is not None], capsize=3, color=colour, label=ref)  # fmt: skip
    chance_drawn = False
    for i, b in enumerate(bars):
        if b.chance is not None:
            ax.hlines(b.chance, i - 0.45, i + 0.45, colors="#c44e52", linestyles="--", linewidth=1.2, zorder=3,
                      label="_nolegend_" if chance_drawn else "chance")  # fmt: skip
            chance_drawn = True
    ax.set_xticks(range(len(bars)), [b.label for b in bars], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    if n > 1 or chance_drawn:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


@dataclass(frozen=True)
class Bar:
    label: str
    values: tuple[tuple[float, float] | None, ...]  # (mean, stderr) per version, None where it has no such figure
    chance: float | None


def family_bars(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str) -> dict[str, list[Bar]]:
    """Families -> their bars (readable labels, one value per version: the compared one first)."""
    ours = relative(metrics, prefix)
    compare = section.get("compare")
    versions = [compare["metrics"], ours] if compare else [ours]
    families: dict[str, list[Bar]] = {}
    for f in figures(metrics, section, prefix):
        if f.family == "other":
            continue
        values = tuple(
            (float(m[f.key]), float(m.get(f.key + ".stderr", 0.0))) if f.key in m and math.isfinite(m[f.key]) else None
            for m in versions
        )
        families.setdefault(f.family, []).append(Bar(f.short, values, f.chance))
    return families


def _table(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str, ref: str) -> str:
    """The figures in prose, each with its eval.json key, chance and (with a comparison) the
    compared version's figure and the change."""
    compare = section.get("compare")
    ours = relative(metrics, prefix)
    rows = figures(metrics, section, prefix)
    heads = ["figure", "key"] + ([compare["ref"]] if compare else []) + [ref] + (["change"] if compare else [])
    heads.append("chance")
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for f in rows:
        cells = [html.escape(f.name), f"<code>{html.escape(f.key)}</code>"]
        if compare:
            cells.append(cell(compare["metrics"], f.key))
        cells.append(cell(ours, f.key))
        if compare:
            cells.append(delta(compare["metrics"], ours, f.key))
        cells.append(chance(f))
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "".join(out) + "</table>"


def _file_name(title: str) -> str:
    return "_".join("".join(c if c.isalnum() or c == "-" else " " for c in title).split())


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render_report(report: Mapping[str, Any], png_dir: Path | None = None) -> str:
    """The HTML of every dataset section of ``report`` (eval.json); PNGs also written to ``png_dir``."""
    try:
        import matplotlib  # noqa: F401

        plots = True
    except ImportError:
        plots = False
    metrics = report.get("metrics", {})
    parts = [f"<h1>Evaluation of {html.escape(str(report.get('model', '?')))} on user data</h1>"]
    if not plots:
        parts.append("<p>matplotlib is not installed (pip install '.[report]'): tables only.</p>")
    for name, section in report.get("datasets", {}).items():
        prefix = f"data.{name}."
        where = f"{section['path']}, split {section['split']}, {section['records']} records, seeds {section['seeds']}"
        parts.append(f"<h2>{html.escape(name)}</h2><p>{html.escape(where)}</p>")
        skipped = section.get("skipped", {})
        if skipped:
            parts.append(
                "<ul>" + "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in skipped.items()) + "</ul>"
            )
        compare = section.get("compare")
        if compare:
            parts.append(f"<p>Beside the figures of {html.escape(compare['ref'])} on the same data "
                         f"({html.escape(compare['source'])}); change = this version minus it.</p>")  # fmt: skip
        encoders = default_encoders(section, str(report.get("model", "?")))
        if encoders:
            parts.append(f"<p>Zero-shot figures use the default text encoder: {html.escape(encoders)}.</p>")
        parts.append(_table(metrics, section, prefix, str(report.get("model", "?"))))
        confused = confused_lines(section)
        if confused:
            parts.append("<h3>confused classes</h3><ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in confused)
                         + "</ul>")  # fmt: skip
        if not plots:
            continue
        plots_: list[tuple[str, bytes]] = []
        zs = section.get("details", {}).get("zeroshot")
        if zs:
            plots_.append(("confusion", confusion_png(zs["labels"], zs["confusion"], zs.get("confusion_comparative"))))
        refs = ([compare["ref"]] if compare else []) + [str(report.get("model", "?"))]
        for family, bars in family_bars(metrics, section, prefix).items():
            plots_.append((family, bars_png(f"{name}: {family}", bars, refs)))
        for title, png in plots_:
            parts.append(f"<h3>{html.escape(title)}</h3>" + _img(png, title))
            if png_dir is not None:
                png_dir.mkdir(parents=True, exist_ok=True)
                (png_dir / f"{name}-{_file_name(title)}.png").write_bytes(png)
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 8px;text-align:left}"
    head = f"<head><meta charset='utf-8'><title>evaluation</title><style>{style}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"
