"""``clip-train evaluate --data``: evaluate a stored version on a user's dataset, write eval.json and
the HTML report into the version (annex files: they may be replaced after publishing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.evaluation.userdata.data import UserEvalConfig, dataset_name
from training.evaluation.userdata.report import REPORT_FILE, render_report
from training.evaluation.userdata.run import evaluate_user_data, merge_into_eval


def evaluate_on_data(
    store: ModelStore,
    ref: str,
    data: Path,
    cfg: UserEvalConfig,
    *,
    name: str | None = None,
    device: str = "cpu",
    write: bool = True,
    out: Path | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict, str]:
    """Evaluate, merge the figures into the version's eval.json and write report.html beside it
    (and into ``out`` with the PNGs, when given). Returns the whole eval.json and the dataset's name."""
    bundle = ModelBundle.load(store, ref, device=device)
    name = name or dataset_name(data)
    metrics, section = evaluate_user_data(bundle, data, cfg, name, log=log)
    raw = store.read_annex(bundle.name, bundle.version, "eval.json")
    existing = None if raw is None else json.loads(raw)
    report = merge_into_eval(existing, bundle.ref, name, metrics, section)
    report["report"] = REPORT_FILE
    page = render_report(report, png_dir=out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / REPORT_FILE).write_text(page)
        (out / "eval.json").write_text(json.dumps(report, indent=2))
    if write:
        store.write_annex(bundle.name, bundle.version, "eval.json", json.dumps(report, indent=2).encode())
        store.write_annex(bundle.name, bundle.version, REPORT_FILE, page.encode())
        log(f"wrote eval.json and {REPORT_FILE} into {bundle.ref}")
    return report, name


def summary_lines(report: dict, name: str) -> list[str]:
    """A markdown table of one dataset's figures (mean ± standard error over seeds)."""
    prefix = f"data.{name}."
    metrics = report["metrics"]
    lines = ["| figure | mean ± stderr |", "|---|---|"]
    for key, value in metrics.items():
        if key.startswith(prefix) and not key.endswith(".stderr"):
            lines.append(f"| {key[len(prefix) :]} | {value:.3f} ± {metrics.get(key + '.stderr', 0.0):.3f} |")
    for family, reason in report["datasets"][name]["skipped"].items():
        lines.append(f"\nskipped {family}: {reason}")
    return lines
