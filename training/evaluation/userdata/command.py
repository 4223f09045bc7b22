"""``clip-train evaluate --data``: evaluate a stored version on a user's dataset, write eval.json and
the HTML report into the version (annex files: they may be replaced after publishing).

With ``--compare name@version`` the figures of another version on the same data sit beside them
(in the printed table, in report.html, and in eval.json under ``datasets.<name>.compare``): read
from its eval.json when it was evaluated on the same data (same split and number of records, the
evaluation gate's rule), else evaluated now with the same settings (and not written into it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from model_store.evaluation import provenance
from training.evaluation.userdata.data import UserEvalConfig, dataset_name
from training.evaluation.userdata.figures import relative
from training.evaluation.userdata.report import REPORT_FILE, render_report
from training.evaluation.userdata.run import evaluate_user_data, merge_into_eval


def compared_figures(
    store: ModelStore,
    ref: str,
    data: Path,
    cfg: UserEvalConfig,
    name: str,
    section: dict[str, Any],
    *,
    device: str = "cpu",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """``{"ref", "metrics" (keys without the dataset prefix), "source"}`` of version ``ref`` on ``name``."""
    version_name, version = store.resolve(ref)
    resolved = f"{version_name}@{version}"
    raw = store.read_annex(version_name, version, "eval.json")
    stored = None if raw is None else json.loads(raw)
    if stored is not None and not provenance(stored, store.manifest(version_name, version)).belongs:
        stored = None  # a copy of another version's figures says nothing of this one
    theirs = (stored or {}).get("datasets", {}).get(name)
    if theirs is not None and all(theirs.get(f) == section.get(f) for f in ("split", "records")):
        metrics = relative(stored["metrics"], f"data.{name}.")  # type: ignore[index]
        log(f"{resolved}: figures on {name} read from its eval.json")
        encoder = theirs.get("details", {}).get("zeroshot", {}).get("encoder")
        return {"ref": resolved, "metrics": metrics, "source": "its eval.json", "seeds": theirs.get("seeds"),
                "default_text_encoder": encoder}  # fmt: skip
    why = "has no figures on" if theirs is None else "was evaluated on other data than"
    log(f"{resolved} {why} {name}: evaluating it now with the same settings (not written into it)")
    bundle = ModelBundle.load(store, resolved, device=device)
    metrics, their_section = evaluate_user_data(bundle, data, cfg, name, log=log)
    return {"ref": resolved, "metrics": relative(metrics, f"data.{name}."), "source": "evaluated now",
            "seeds": their_section["seeds"], "default_text_encoder": bundle.default_text_encoder}  # fmt: skip


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
    compare: str | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict, str]:
    """Evaluate, merge the figures into the version's eval.json and write report.html beside it
    (and into ``out`` with the PNGs, when given); with ``compare``, another version's figures on the
    same data beside them. Returns the whole eval.json and the dataset's name."""
    bundle = ModelBundle.load(store, ref, device=device)
    if compare is not None:
        store.resolve(compare)  # an unknown version stops the command before the evaluation
    name = name or dataset_name(data)
    metrics, section = evaluate_user_data(bundle, data, cfg, name, log=log)
    if compare is not None:
        section["compare"] = compared_figures(store, compare, data, cfg, name, section, device=device, log=log)
    raw = store.read_annex(bundle.name, bundle.version, "eval.json")
    existing = None if raw is None else json.loads(raw)
    if existing is not None and not provenance(existing, bundle.manifest).belongs:
        log(f"{provenance(existing, bundle.manifest).foreign}: its figures are not kept")
    report = merge_into_eval(existing, bundle.manifest, name, metrics, section)
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
