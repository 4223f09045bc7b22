"""A tiny model whose comparatives library was evaluated: the playground's preset labels, a library
for two of them, and an eval.json bound to the version (as ``clip-train evaluate --data`` writes
it) holding the zero-shot accuracies with and without the library on a labelled dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PRESET_LABELS = ["red circle", "orange circle", "blue square", "green triangle"]  # the playground's
LIBRARY = [{"a": "red circle", "b": "orange circle", "text": "the first is deep red, while the second is orange."}]
DATASET = "shapes-test"
FIGURES = {
    "zeroshot.acc": 0.5,
    "zeroshot.acc.stderr": 0.004,
    "zeroshot_comparative.acc": 0.52,
    "zeroshot_comparative.acc.stderr": 0.004,
    "gain.zeroshot_comparative.acc": 0.02,
    "gain.zeroshot_comparative.acc.stderr": 0.005,
    "zeroshot.confused_acc": 0.41,
    "zeroshot.confused_acc.stderr": 0.01,
    "zeroshot_comparative.confused_acc": 0.47,
    "zeroshot_comparative.confused_acc.stderr": 0.01,
}


def evaluation(manifest: Any, labels: list[str] = PRESET_LABELS) -> dict[str, Any]:  # noqa: ANN401
    from model_store.evaluation import bind

    section = {"path": "shapes/test.jsonl", "split": "all", "records": 400, "seeds": [0, 1, 2],
               "details": {"zeroshot": {"labels": sorted(labels), "n_images": 400,
                                        "comparative_classes": ["orange circle", "red circle"]}}}  # fmt: skip
    metrics = {f"data.{DATASET}.{k}": v for k, v in FIGURES.items()}
    return bind({"metrics": metrics, "datasets": {DATASET: section}}, manifest)


def publish_measured(root: Path, name: str = "measured", *, bound: bool = True) -> str:
    """Publish the model and write its eval.json (``bound=False``: one bound to other weights, which
    says nothing of this version); returns the version."""
    from loadtests.local_stack import publish_tiny
    from model_store import ModelStore

    version = publish_tiny(root, name, comparatives=LIBRARY)
    store = ModelStore(root)
    manifest = store.manifest(name, version)
    report = evaluation(manifest)
    if not bound:
        report["version"]["files"] = {f: "0" * 64 for f in report["version"]["files"]}
    store.write_annex(name, version, "eval.json", json.dumps(report).encode())
    return version
