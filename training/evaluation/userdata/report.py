"""The evaluation report of a version: one self-contained HTML file (plots embedded as PNG) rendered
from eval.json alone, so it can be rebuilt any time and covers every dataset evaluated.

Per dataset: a table of every figure (mean ± standard error over seeds), the confusion matrix
before and after comparative prompting, and per-family bars with error bars. Plots need
matplotlib (the ``report`` extra); without it the report holds the tables only and says so.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def bars_png(title: str, bars: Mapping[str, tuple[float, float]]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(3.5, 0.9 * len(bars) + 1.5), 3.2))
    names = list(bars)
    ax.bar(range(len(names)), [bars[n][0] for n in names], yerr=[bars[n][1] for n in names], capsize=4,
           color="#4c72b0")  # fmt: skip
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title, fontsize=10)
    return _png(fig)


def family_bars(metrics: Mapping[str, float], prefix: str) -> dict[str, dict[str, tuple[float, float]]]:
    """Families -> bar name -> (mean, stderr), from the flat keys of one dataset."""
    families: dict[str, dict[str, tuple[float, float]]] = {}
    for key, value in metrics.items():
        if not key.startswith(prefix) or key.endswith(".stderr"):
            continue
        rest = key[len(prefix) :]
        err = float(metrics.get(key + ".stderr", 0.0))
        head, _, tail = rest.partition(".")
        if head.startswith("zeroshot"):
            if tail in ("acc", "confused_acc"):
                families.setdefault("zero-shot", {})[f"{head.replace('zeroshot', 'standard').lstrip('_')} {tail}"] = (
                    value,
                    err,
                )
        elif head in ("rank_pair", "hard_negatives", "semclip", "winoground"):
            families.setdefault(head, {})[tail] = (value, err)
    return families


def _table(metrics: Mapping[str, float], prefix: str) -> str:
    rows = []
    for key, value in metrics.items():
        if key.startswith(prefix) and not key.endswith(".stderr"):
            err = metrics.get(key + ".stderr", 0.0)
            rows.append(f"<tr><td>{html.escape(key[len(prefix) :])}</td><td>{value:.3f} ± {err:.3f}</td></tr>")
    return "<table><tr><th>figure</th><th>mean ± stderr</th></tr>" + "".join(rows) + "</table>"


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
        parts.append(_table(metrics, prefix))
        if not plots:
            continue
        figures: list[tuple[str, bytes]] = []
        zs = section.get("details", {}).get("zeroshot")
        if zs:
            figures.append(("confusion", confusion_png(zs["labels"], zs["confusion"], zs.get("confusion_comparative"))))
        for family, bars in family_bars(metrics, prefix).items():
            figures.append((family, bars_png(f"{name}: {family}", bars)))
        for title, png in figures:
            parts.append(f"<h3>{html.escape(title)}</h3>" + _img(png, title))
            if png_dir is not None:
                png_dir.mkdir(parents=True, exist_ok=True)
                (png_dir / f"{name}-{title.replace(' ', '_')}.png").write_bytes(png)
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 8px;text-align:left}"
    head = f"<head><meta charset='utf-8'><title>evaluation</title><style>{style}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(parts)}</body></html>"
