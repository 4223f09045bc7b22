"""``/classify?comparative=true`` says what the version's comparatives library was measured to do
(its eval.json), beside every answer that used the library, and only then."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from measured_model import DATASET, FIGURES, PRESET_LABELS, publish_measured

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def server(serve_app: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("store")
    publish_measured(root, "measured")
    publish_measured(root, "copied", bound=False)
    with serve_app(store=str(root), model="measured,copied@production") as running:
        yield running.url


def classify(url: str, labels: list[str], *, comparative: bool = True, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    image = {"data": base64.b64encode((EXAMPLES / "red.png").read_bytes()).decode()}
    body = {"images": [image], "labels": labels, **extra}
    response = httpx.post(f"{url}/classify", params={"comparative": str(comparative).lower()}, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["comparative"]


def test_a_library_answer_carries_the_measured_effect(server: str) -> None:
    info = classify(server, PRESET_LABELS)
    assert info["source"] == "library" and info["applied"]
    (measured,) = info["measured"]
    assert measured == {
        "dataset": DATASET,
        "classes": 4,
        "same_labels": True,
        "confused_classes": ["orange circle", "red circle"],
        "seeds": 3,
        "images_per_seed": 400,
        "accuracy_standard": FIGURES["zeroshot.acc"],
        "accuracy_comparative": FIGURES["zeroshot_comparative.acc"],
        "change": FIGURES["gain.zeroshot_comparative.acc"],
        "change_stderr": FIGURES["gain.zeroshot_comparative.acc.stderr"],
        "confused_standard": FIGURES["zeroshot.confused_acc"],
        "confused_comparative": FIGURES["zeroshot_comparative.confused_acc"],
    }
    # Other labels that still meet the library: measured on other labels, and said so.
    other = classify(server, ["red circle", "orange circle", "purple star"])
    assert other["source"] == "library" and other["measured"][0]["same_labels"] is False


def test_no_measured_effect_where_the_library_was_not_used_or_not_measured(server: str) -> None:
    assert classify(server, PRESET_LABELS, comparative=False).get("measured") is None
    request = [{"a": "blue square", "b": "green triangle", "text": "the first has corners, the second three."}]
    assert classify(server, PRESET_LABELS, comparatives=request).get("measured") is None  # the request's own
    assert classify(server, ["blue square", "green triangle"])["source"] == "none"
    # An eval.json bound to other weights says nothing of this version's library.
    copied = classify(server, PRESET_LABELS, model="copied@production")
    assert copied["source"] == "library" and copied.get("measured") is None
