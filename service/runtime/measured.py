"""What a version's own evaluation measured of its comparatives library, read once per load so that
``/classify?comparative=true`` can say it beside every answer that used the library.

``clip-train evaluate --data`` classifies a dataset's held-out photos exactly as ``/classify`` does
(the request defaults: alpha 0.9, one-sided, no margin gate), with and without the library's
comparatives for the dataset's labels, and records both accuracies and the per-seed difference
(``data.<dataset>.zeroshot.acc``, ``...zeroshot_comparative.acc``,
``...gain.zeroshot_comparative.acc``, each with its ``.stderr``). An eval.json that is not this
version's evaluation (copied from other weights, ``model_store.evaluation``) says nothing of it and
is not read.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from model_store import ModelStore
from model_store.evaluation import EVAL_FILE, provenance
from model_store.manifest import Manifest

log = logging.getLogger("service.models")


@dataclass(frozen=True)
class MeasuredComparatives:
    """The library's effect on one evaluated dataset (accuracies in [0, 1])."""

    dataset: str
    labels: tuple[str, ...]
    confused_classes: tuple[str, ...]  # the labels the library's comparatives name
    seeds: int
    images_per_seed: int | None
    accuracy_standard: float
    accuracy_comparative: float
    change: float
    change_stderr: float
    confused_standard: float | None = None
    confused_comparative: float | None = None


def _figure(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def comparative_effects(report: Mapping[str, Any]) -> list[MeasuredComparatives]:
    """The effect of the comparatives on every dataset of ``report`` (a parsed eval.json) that has
    both accuracies; the change is the paired per-seed one where recorded, else the difference of
    the two means (with the standard error of two independent means)."""
    metrics = report.get("metrics")
    datasets = report.get("datasets")
    if not isinstance(metrics, Mapping) or not isinstance(datasets, Mapping):
        return []
    out = []
    for name, section in sorted(datasets.items()):
        prefix = f"data.{name}."
        standard = _figure(metrics, f"{prefix}zeroshot.acc")
        comparative = _figure(metrics, f"{prefix}zeroshot_comparative.acc")
        if standard is None or comparative is None or not isinstance(section, Mapping):
            continue
        gain = _figure(metrics, f"{prefix}gain.zeroshot_comparative.acc")
        if gain is not None:
            stderr = _figure(metrics, f"{prefix}gain.zeroshot_comparative.acc.stderr") or 0.0
        else:
            gain = comparative - standard
            stderr = math.hypot(_figure(metrics, f"{prefix}zeroshot.acc.stderr") or 0.0,
                                _figure(metrics, f"{prefix}zeroshot_comparative.acc.stderr") or 0.0)  # fmt: skip
        zeroshot = section.get("details", {}).get("zeroshot", {})
        seeds = section.get("seeds")
        out.append(
            MeasuredComparatives(
                dataset=str(name),
                labels=tuple(str(label) for label in zeroshot.get("labels", [])),
                confused_classes=tuple(str(label) for label in zeroshot.get("comparative_classes", [])),
                seeds=len(seeds) if isinstance(seeds, list) else 1,
                images_per_seed=zeroshot.get("n_images"),
                accuracy_standard=standard,
                accuracy_comparative=comparative,
                change=gain,
                change_stderr=stderr,
                confused_standard=_figure(metrics, f"{prefix}zeroshot.confused_acc"),
                confused_comparative=_figure(metrics, f"{prefix}zeroshot_comparative.confused_acc"),
            )
        )
    return out


def read_comparative_effects(store: ModelStore, manifest: Manifest) -> list[MeasuredComparatives]:
    """The effects recorded in the version's eval.json (none when it has none, it cannot be read,
    or it is another version's)."""
    try:
        raw = store.read_annex(manifest.name, manifest.version, EVAL_FILE)
        report = None if raw is None else json.loads(raw)
    except (OSError, ValueError) as exc:  # an unreadable report must not stop the version from serving
        log.warning("ignoring unreadable %s of %s: %s", EVAL_FILE, manifest.ref, exc)
        return []
    if not isinstance(report, dict) or not provenance(report, manifest).belongs:
        return []
    return comparative_effects(report)
