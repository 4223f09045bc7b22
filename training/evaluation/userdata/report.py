"""The evaluation report of a version: one self-contained HTML file (plots embedded as PNG) rendered
from eval.json alone, so it can be rebuilt any time and covers every dataset evaluated.

Per dataset: a table of every figure the version's components allow, in prose with its eval.json
key, what each component adds over the figure it replaces (the change column) and chance level
(and, after ``--compare``, the compared version's figure and this one minus it), the confused
classes, the confusion matrix before and after comparative prompting, per-family bars with error
bars and a dashed chance line (the replaced figure's bar beside each component's, the compared
version's bars beside them), and what each row measures (``explain.py``). It fits a 1,400 px
window and a phone (tests/training_job/test_report_browser.py). Plots need
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

from training.evaluation.userdata.explain import explanations
from training.evaluation.userdata.figures import (
    Figure,
    cell,
    chance,
    chance_of,
    change,
    change_note,
    component_gain,
    confused_lines,
    default_encoders,
    describe,
    figures,
    relative,
    signed,
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


# At most this wide (inches at the report's 110 dpi: about 1,300 px) and scaled down by the page
# (``img{max-width:100%}``), so a chart never widens report.html beyond a 1,400 px window.
MAX_CHART_INCHES = 11.8


def bars_png(title: str, bars: Sequence[Bar], refs: Sequence[str]) -> bytes:
    """One bar per figure and version (``refs``: the compared version first, when there is one),
    with its standard error, the change a component adds written above its bar and, where the
    figure has one, a dashed chance line across its bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(refs)
    width = 0.8 / n
    inches = min(MAX_CHART_INCHES, max(3.5, (0.6 + 0.45 * n) * len(bars) + 1.5))
    fig, ax = plt.subplots(figsize=(inches, 3.6))
    colours = ["#4c72b0", "#dd8452"] if n == 2 else ["#4c72b0"]
    for j, (ref, colour) in enumerate(zip(refs, colours, strict=False)):
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(bars))]
        values = [b.values[j] for b in bars]
        ax.bar([x for x, v in zip(xs, values, strict=True) if v is not None],
               [v[0] for v in values if v is not None], width=width * 0.95,
               yerr=[v[1] for v in values if v is not None], capsize=3, color=colour, label=ref)  # fmt: skip
    ours = n - 1
    for i, b in enumerate(bars):
        value = b.values[ours]
        if b.change and value is not None:  # the first number of "+0.415 ± 0.012": the chart stays legible
            x = i - 0.4 + width * (ours + 0.5)
            ax.text(x, min(value[0] + value[1] + 0.02, 0.97), b.change.split(" ±")[0], ha="center", va="bottom",
                    fontsize=7, color="#2a6a2a")  # fmt: skip
    chance_drawn = False
    for i, b in enumerate(bars):
        if b.chance is not None:
            ax.hlines(b.chance, i - 0.45, i + 0.45, colors="#c44e52", linestyles="--", linewidth=1.2, zorder=3,
                      label="_nolegend_" if chance_drawn else "chance")  # fmt: skip
            chance_drawn = True
    ax.set_xticks(range(len(bars)), [b.label for b in bars], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.set_title(title + ("\n(green: what a component adds over the bar it replaces)" if any(b.change for b in bars)
                          else ""), fontsize=10)  # fmt: skip
    if n > 1 or chance_drawn:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


@dataclass(frozen=True)
class Bar:
    label: str
    values: tuple[tuple[float, float] | None, ...]  # (mean, stderr) per version, None where it has no such figure
    chance: float | None
    change: str = ""  # what a component adds over the bar it replaces (this version's), written above its bar


def _bar(f: Figure, versions: Sequence[Mapping[str, float]], label: str | None = None) -> Bar:
    values = tuple(
        (float(m[f.key]), float(m.get(f.key + ".stderr", 0.0))) if f.key in m and math.isfinite(m[f.key]) else None
        for m in versions
    )
    gain = component_gain(versions[-1], f)
    return Bar(label or f.short, values, chance_of(f, versions[-1]), "" if gain is None else signed(*gain))


def family_bars(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str) -> dict[str, list[Bar]]:
    """Families -> their bars (readable labels, one value per version: the compared one first).
    A component's figure has the figure it replaces beside it (the base encoder's bar in the
    negation-by-encoder chart comes from the hard negatives), and its change written above it."""
    ours = relative(metrics, prefix)
    compare = section.get("compare")
    versions = [compare["metrics"], ours] if compare else [ours]
    zeroshot = section.get("details", {}).get("zeroshot")
    rows = [f for f in figures(metrics, section, prefix) if f.family != "other"]
    families: dict[str, list[Bar]] = {}
    for f in rows:
        bars = families.setdefault(f.family, [])
        in_family = {r.key for r in rows if r.family == f.family}
        if f.replaces is not None and f.replaces not in in_family:
            replaced = describe(f.replaces, zeroshot)
            label = f"{f.versus} ({replaced.short})"
            if label not in [b.label for b in bars]:
                bars.append(_bar(replaced, versions, label))
        bars.append(_bar(f, versions))
    return families


def _table(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str, ref: str) -> str:
    """The figures in prose, each with its eval.json key, the change (what a component adds; with a
    comparison, also the compared version's figure and this one minus it) and chance."""
    compare = section.get("compare")
    ours = relative(metrics, prefix)
    base = compare["metrics"] if compare else None
    heads = ["figure", "key"] + ([compare["ref"]] if compare else []) + [ref, "change", "chance"]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for f in figures(metrics, section, prefix):
        cells = [html.escape(f.name), f"<code>{html.escape(f.key)}</code>"]
        if base is not None:
            cells.append(cell(base, f.key))
        changed = html.escape(change(f, ours, base, compare["ref"] if compare else ""))
        cells += [cell(ours, f.key), changed, chance(f, ours)]
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<div class='wide'>" + "".join(out) + "</table></div>"


def _file_name(title: str) -> str:
    return "_".join("".join(c if c.isalnum() or c == "-" else " " for c in title).split())


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _plots(
    metrics: Mapping[str, float], section: Mapping[str, Any], name: str, refs: list[str]
) -> list[tuple[str, bytes]]:
    """(title, PNG) of the confusion matrices and of one bar chart per family."""
    out: list[tuple[str, bytes]] = []
    zs = section.get("details", {}).get("zeroshot")
    if zs:
        out.append(("confusion", confusion_png(zs["labels"], zs["confusion"], zs.get("confusion_comparative"))))
    for family, bars in family_bars(metrics, section, f"data.{name}.").items():
        out.append((family, bars_png(f"{name}: {family}", bars, refs)))
    return out


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
                         f"({html.escape(compare['source'])}).</p>")  # fmt: skip
        encoders = default_encoders(section, str(report.get("model", "?")))
        if encoders:
            parts.append(f"<p>Zero-shot figures use the default text encoder: {html.escape(encoders)}.</p>")
        parts.append(f"<p>{html.escape(change_note(compare, str(report.get('model', '?'))))}.</p>")
        parts.append(_table(metrics, section, prefix, str(report.get("model", "?"))))
        confused = confused_lines(section)
        if confused:
            parts.append("<h3>confused classes</h3><ul>" + "".join(f"<li>{html.escape(c)}</li>" for c in confused)
                         + "</ul>")  # fmt: skip
        if plots:
            refs = ([compare["ref"]] if compare else []) + [str(report.get("model", "?"))]
            for title, png in _plots(metrics, section, name, refs):
                parts.append(f"<h3>{html.escape(title)}</h3>" + _img(png, title))
                if png_dir is not None:
                    png_dir.mkdir(parents=True, exist_ok=True)
                    (png_dir / f"{name}-{_file_name(title)}.png").write_bytes(png)
        rows = figures(metrics, section, prefix)
        parts.append("<h3>what each row measures</h3><dl>" + "".join(
            f"<dt>{html.escape(row)}</dt><dd>{html.escape(text)}</dd>" for row, text in explanations(rows, section)
        ) + "</dl>")  # fmt: skip
    # Fits a 1,400 px window and a phone: images scale down, a wide table scrolls inside its box.
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 8px}"
             "img{max-width:100%;height:auto}.wide{overflow-x:auto}"
             ".wide table{min-width:820px}td,th{padding:2px 8px;text-align:left;vertical-align:top}"
             "td:nth-child(n+3){white-space:nowrap}"
             "p,li,dd{overflow-wrap:anywhere}dt{font-weight:bold;margin-top:6px}")  # fmt: skip
    viewport = "<meta name='viewport' content='width=device-width, initial-scale=1'>"
    head = f"<head><meta charset='utf-8'>{viewport}<title>evaluation</title><style>{style}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"
