"""The SDK splits work larger than the server's limits and merges the answers in order.

Two real servers serve the same tiny model with a DCSM scorer: one with small limits (few items
and a small body cap per request), one with the defaults. The SDK's answer from the first,
assembled from several requests, must equal the single answer of the second; with splitting off,
the small server refuses the same work (413).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from clipdiff import Client, PayloadTooLarge, ServerLimits

LARGER = "The first image contains a larger shape, while the second contains a smaller shape."
SMALL = {"max_texts": 3, "max_images": 2, "max_pairs": 2, "max_body_bytes": 80_000}
TEXTS = [f"a {c} {s}" for c in ("red", "blue", "green") for s in ("circle", "square", "cross")][:8]


@pytest.fixture(scope="module")
def dense_store(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any) -> Path:
    root = tmp_path_factory.mktemp("split-store")
    publish_dense_model(root)
    return root


@pytest.fixture(scope="module")
def small(dense_store: Path, serve_app: Any) -> Iterator[Client]:
    with serve_app(store=str(dense_store), model="dense@production", limits=SMALL) as running:
        with Client(running.url, timeout=120) as client:
            yield client


@pytest.fixture(scope="module")
def reference(dense_store: Path, serve_app: Any) -> Iterator[Client]:
    with serve_app(store=str(dense_store), model="dense@production") as running:
        with Client(running.url, timeout=120) as client:
            yield client


@pytest.fixture
def requests_sent(small: Client) -> Iterator[list[str]]:
    """Paths of the requests ``small`` sends during a test."""
    sent: list[str] = []

    def hook(request: httpx.Request) -> None:
        sent.append(request.url.path)

    small._http.event_hooks["request"].append(hook)
    yield sent
    small._http.event_hooks["request"].remove(hook)


def noisy_png(seed: int, px: int = 110) -> bytes:
    """A PNG of noise (about 36 KB, 48 KB in base64): one fits the small body cap, two do not."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(px, px, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def shape_png(make_image: Any, *args: str) -> bytes:
    return base64.b64decode(make_image(*args)["data"])


def test_limits_are_read_from_the_server(small: Client) -> None:
    limits = small.limits()
    assert isinstance(limits, ServerLimits)
    assert {k: getattr(limits, k) for k in SMALL} == SMALL


def test_embed_texts_split_by_count(small: Client, reference: Client, requests_sent: list[str]) -> None:
    split = small.embed_texts(TEXTS)
    whole = reference.embed_texts(TEXTS)
    assert requests_sent.count("/embed") == 3  # 8 texts, 3 per request
    assert split.ids == whole.ids and split.dim == whole.dim and split.model == whole.model
    np.testing.assert_allclose(split.as_numpy(), whole.as_numpy(), atol=1e-3)


def test_embed_images_split_by_body_bytes_as_numpy(small: Client, reference: Client, requests_sent: list[str]) -> None:
    images = [noisy_png(i) for i in range(3)]
    split = small.embed_images(images, as_numpy=True)
    assert isinstance(split.embeddings, np.ndarray) and split.embeddings.dtype == np.float32
    assert requests_sent.count("/embed") == 3  # two per request would pass the count, not the body cap
    whole = reference.embed_images(images)
    assert split.ids == whole.ids
    np.testing.assert_allclose(split.embeddings, whole.as_numpy(), atol=1e-3)


def test_without_splitting_the_server_refuses(small: Client) -> None:
    with Client(str(small._http.base_url), split=False) as unsplit, pytest.raises(PayloadTooLarge):
        unsplit.embed_texts(TEXTS)


def test_classify_rank_and_pairs_merge_in_order(small: Client, reference: Client, make_image: Any) -> None:
    sizes = ["small", "large", "medium", "large", "small"]
    images = [shape_png(make_image, "circle", "red", s) for s in sizes]
    labels = ["circle", "square", "cross"]
    split, whole = small.classify(images, labels), reference.classify(images, labels)
    assert split.labels == whole.labels and len(split.results) == 5
    for a, b in zip(split.results, whole.results):
        assert [s.label for s in a.top_k] == [s.label for s in b.top_k]
        np.testing.assert_allclose([s.probability for s in a.top_k], [s.probability for s in b.top_k], atol=1e-3)

    # 5 images, 2 per request: the last part repeats an image, which the merge drops
    ranked, ranked_whole = small.rank(images, LARGER), reference.rank(images, LARGER)
    np.testing.assert_allclose(ranked.scores, ranked_whole.scores, atol=1e-3)
    assert len(ranked.scores) == 5 and sorted(ranked.order) == list(range(5))
    assert [ranked.scores[i] for i in ranked.order] == sorted(ranked.scores, reverse=True)

    pairs = [(images[i], images[i + 1], LARGER) for i in range(4)] + [(images[0], images[4], LARGER)]
    got, want = small.rank_pairs(pairs), reference.rank_pairs(pairs)
    assert [p.first for p in got] == [p.first for p in want] and len(got) == 5
    np.testing.assert_allclose([p.score for p in got], [p.score for p in want], atol=1e-3)


def test_score_dense_merges_texts_and_best(small: Client, reference: Client, make_image: Any) -> None:
    image = shape_png(make_image, "circle", "red", "large")
    split = small.score_dense(image, TEXTS, return_maps=True)
    whole = reference.score_dense(image, TEXTS, return_maps=True)
    np.testing.assert_allclose(split.scores, whole.scores, atol=1e-4)
    assert split.best == whole.best == int(np.argmax(whole.scores))
    assert split.functional_words == whole.functional_words and split.tokens == whole.tokens
    assert split.maps is not None and len(split.maps) == len(TEXTS)
