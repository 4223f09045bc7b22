"""End to end through the Python SDK: a real server serving the committed default model.

The server is the real app under uvicorn on 127.0.0.1 with the repository's ``models`` store
and a real redis-server (fixtures of ``tests/conftest.py``). Images are clean drawings from
``draw_scene_pil``, a renderer the model was not trained on, so these tests check that answers
*mean* something, not only their shape. Accuracy bars are set where a model of about 90 %
accuracy passes reliably and a model that does not understand shapes, colours or sizes fails.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from clipdiff import AsyncClient, Client, ImageRef, NotFound, image_id, image_input, image_sha256
from training.world.render import draw_scene_pil
from training.world.scene import Scene, SceneObject
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES, SIZE_RANGES

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "models"
MODEL = "default@production"
LARGER = "The first image contains a larger shape, while the second contains a smaller shape."
RED_BLUE = "The first shape is red, while the second is blue."
MIN_ACCURACY = 0.8


# ----------------------------------------------------------------------------- server
@pytest.fixture(scope="module")
def sdk_server(serve_app: Any, service_redis: Any) -> Iterator[str]:
    """Base URL of the real app serving ``default@production`` from the repo's store, with Redis."""
    if not (STORE / "default" / "aliases.json").exists():
        pytest.skip(f"the committed default model is not in {STORE} yet")
    with serve_app(store=str(STORE), model=MODEL, redis_url=service_redis.url) as running:
        yield running.url


@pytest.fixture(scope="module")
def client(sdk_server: str) -> Iterator[Client]:
    with Client(sdk_server, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def serving(client: Client) -> str:
    return client.models().serving or ""


# ----------------------------------------------------------------------------- images
def draw(shape: str, colour: str, radius: float = 0.2, x: float = 0.5, y: float = 0.5,
         size: int = 224, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:  # fmt: skip
    size_class = next((k for k, (lo, hi) in SIZE_RANGES.items() if lo <= radius <= hi), "medium")
    scene = Scene((SceneObject(shape, colour, size_class, radius, x, y),))
    return draw_scene_pil(scene, size=size, background=background)


# Positions and backgrounds vary a little so no answer rests on one exact drawing.
SPOTS = [(0.5, 0.5, (255, 255, 255)), (0.42, 0.55, (245, 245, 245)), (0.58, 0.45, (255, 255, 255)),
         (0.5, 0.4, (235, 235, 235))]  # fmt: skip


def seen_combo(colour: str, shape: str) -> bool:
    return (colour, shape) not in HELD_OUT_COMBOS


def accuracy(predicted: list[str], truth: list[str]) -> float:
    return sum(p == t for p, t in zip(predicted, truth, strict=True)) / len(truth)


# ----------------------------------------------------------------------------- basics
def test_health_ready_and_models(client: Client, serving: str) -> None:
    assert client.health() and client.ready()
    assert serving.startswith("default@")
    info = client.model("default")
    assert info.serving == serving.split("@", 1)[1]
    assert "production" in info.aliases
    with pytest.raises(NotFound):
        client.model("no-such-model")


# ----------------------------------------------------------------------------- zero-shot
def test_zero_shot_picks_the_shape(client: Client, serving: str) -> None:
    colours = ["red", "blue", "green", "orange"]
    cases = [(s, c, spot) for s in SHAPES for c, spot in zip(colours, SPOTS) if seen_combo(c, s)]
    images = [draw(s, c, 0.2, x, y, background=bg) for s, c, (x, y, bg) in cases]
    res = client.classify(images, list(SHAPES), top_k=1)
    acc = accuracy(res.labels, [s for s, _, _ in cases])
    print(f"zero-shot shape accuracy: {acc:.3f} on {len(cases)} images")
    assert res.model == serving
    assert acc >= MIN_ACCURACY, list(zip(res.labels, [s for s, _, _ in cases]))


def test_zero_shot_picks_the_colour(client: Client) -> None:
    shapes = ["circle", "square", "diamond"]
    cases = [(s, c) for c in COLOUR_NAMES for s in shapes if seen_combo(c, s)]
    images = [draw(s, c, 0.19, *SPOTS[i % len(SPOTS)][:2]) for i, (s, c) in enumerate(cases)]
    res = client.classify(images, list(COLOUR_NAMES), top_k=1)
    acc = accuracy(res.labels, [c for _, c in cases])
    print(f"zero-shot colour accuracy: {acc:.3f} on {len(cases)} images")
    assert acc >= MIN_ACCURACY, list(zip(res.labels, [c for _, c in cases]))


def test_zero_shot_picks_colour_and_shape_together(client: Client) -> None:
    colours = ["red", "yellow", "green", "blue", "purple"]
    labels = [f"{c} {s}" for c in colours for s in SHAPES]
    cases = [(s, c) for c in colours for s in SHAPES if seen_combo(c, s)]
    images = [draw(s, c, 0.2) for s, c in cases]
    res = client.classify(images, labels, top_k=3)
    acc = accuracy(res.labels, [f"{c} {s}" for s, c in cases])
    print(f"zero-shot colour+shape accuracy: {acc:.3f} on {len(cases)} images, {len(labels)} labels")
    assert acc >= MIN_ACCURACY
    for r in res.results:
        probs = [s.probability for s in r.top_k]
        assert probs == sorted(probs, reverse=True) and r.label == r.top_k[0].label


# ----------------------------------------------------------------------------- pair ranking
SIZE_CASES = [("circle", "red"), ("square", "green"), ("triangle", "blue"), ("diamond", "orange"),
              ("cross", "purple"), ("circle", "cyan"), ("square", "yellow"), ("triangle", "purple")]  # fmt: skip


def test_rank_pair_picks_the_larger_shape_and_flips_when_swapped(client: Client, serving: str) -> None:
    forward, backward = [], []
    for shape, colour in SIZE_CASES:
        large, small = draw(shape, colour, 0.22), draw(shape, colour, 0.09)
        forward.append(client.rank_pair(large, small, LARGER))
        backward.append(client.rank_pair(small, large, LARGER))
    assert all(p.model == serving for p in forward)
    for f, b in zip(forward, backward):
        assert {f.first, b.first} == {"a", "b"}, "swapping the images must swap the answer"
        assert f.score == pytest.approx(-b.score, abs=1e-5)
    acc = sum(p.first == "a" for p in forward) / len(forward)
    print(f"rank-pair larger-shape accuracy: {acc:.3f} on {len(forward)} pairs")
    assert acc >= MIN_ACCURACY, [p.score for p in forward]


def test_rank_pair_colour_difference(client: Client) -> None:
    decisions = []
    for i, shape in enumerate(SHAPES):
        red, blue = draw(shape, "red", 0.2, *SPOTS[i % 4][:2]), draw(shape, "blue", 0.2, *SPOTS[(i + 1) % 4][:2])
        ab, ba = client.rank_pair(red, blue, RED_BLUE), client.rank_pair(blue, red, RED_BLUE)
        assert {ab.first, ba.first} == {"a", "b"}
        decisions.append(ab.first == "a")
    acc = sum(decisions) / len(decisions)
    print(f"rank-pair red-vs-blue accuracy: {acc:.3f} on {len(decisions)} pairs")
    assert acc >= MIN_ACCURACY


def test_batch_pairs_equal_single_calls(client: Client) -> None:
    pairs = [
        (draw("circle", "red", 0.22), draw("circle", "red", 0.09), LARGER),
        (draw("square", "red", 0.2), draw("square", "blue", 0.2), RED_BLUE),
        (draw("diamond", "blue", 0.1), draw("diamond", "blue", 0.2), LARGER),
    ]
    batch = client.rank_pairs(pairs)
    singles = [client.rank_pair(a, b, d) for a, b, d in pairs]
    assert [p.first for p in batch] == [p.first for p in singles]
    assert [p.score for p in batch] == pytest.approx([p.score for p in singles], abs=1e-5)


def size_class(radius: float) -> str:
    return next(k for k, (lo, hi) in SIZE_RANGES.items() if lo <= radius <= hi)


def test_rank_order_agrees_with_pairwise_answers(client: Client) -> None:
    radii = [0.13, 0.23, 0.08, 0.18]  # shuffled so input order says nothing; 0.18 and 0.23 are both "large"
    images = [draw("square", "blue", r) for r in radii]
    res = client.rank(images, LARGER)
    assert sorted(res.order) == [0, 1, 2, 3] and len(res.scores) == 4
    assert [res.scores[r.index] for r in res.ranking] == pytest.approx([r.score for r in res.ranking])
    position = {index: pos for pos, index in enumerate(res.order)}
    for i, j in itertools.combinations(range(4), 2):
        pair = client.rank_pair(images[i], images[j], LARGER)
        assert (pair.first == "a") == (position[i] < position[j]), (i, j, pair.score, res.scores)
    by_size = sorted(range(4), key=lambda k: -radii[k])
    print(f"rank order {res.order}, true size order {by_size}")
    # Shapes of different size classes must come out in size order; two shapes of the same
    # class ("large" 0.18 vs 0.23) are the known hard case and are measured by the evaluation
    # (rank_pair.size_same_class), not asserted here.
    for i, j in itertools.combinations(range(4), 2):
        if size_class(radii[i]) != size_class(radii[j]):
            assert (position[i] < position[j]) == (radii[i] > radii[j]), (radii[i], radii[j], res.order)


# ----------------------------------------------------------------------------- comparative
# ----------------------------------------------------------------------------- SemCLIP / YUKINO
THREE_COLOUR_PAIRS = (("red", "blue"), ("green", "orange"), ("purple", "yellow"))


def colour_swap_accuracy(
    client: Client,
    encoder: str | None,
    method: str = "standard",
    colour_pairs: Sequence[tuple[str, str]] = THREE_COLOUR_PAIRS,
) -> float:
    """Two shapes side by side: the true caption against the one with their colours swapped
    (a negation SemCLIP was trained to push away, and a binding swap YUKINO was trained on;
    plain cosine is near chance on such swaps)."""
    cases = [(s1, c1, s2, c2) for s1, s2 in itertools.permutations(("circle", "square", "triangle", "cross"), 2)
             for c1, c2 in colour_pairs
             if all(seen_combo(c, s) for c in (c1, c2) for s in (s1, s2))]  # fmt: skip
    hits = 0
    for s1, c1, s2, c2 in cases:
        scene = Scene(
            (SceneObject(s1, c1, "medium", 0.14, 0.28, 0.5), SceneObject(s2, c2, "medium", 0.14, 0.72, 0.5)), "left of"
        )
        true = f"a photo of a {c1} {s1} to the left of a {c2} {s2}."
        swapped = f"a photo of a {c2} {s1} to the left of a {c1} {s2}."
        res = client.classify([draw_scene_pil(scene, size=224)], [swapped, true], templates=["{}"], encoder=encoder,
                              method=method)  # fmt: skip
        hits += res.labels[0] == true
    return hits / len(cases)


def test_semclip_encoder_rejects_swapped_colours(client: Client) -> None:
    semclip, base = colour_swap_accuracy(client, "semclip"), colour_swap_accuracy(client, "base")
    print(f"true caption over its colour swap: semclip {semclip:.3f}, base {base:.3f}")
    assert semclip >= 0.85 and semclip > base


def test_yukino_method_is_served(client: Client, serving: str) -> None:
    res = client.classify(
        [draw("circle", "red", 0.2)],
        ["a photo of a red circle.", "there is no red circle."],
        templates=["{}"],
        method="yukino",
    )
    assert res.model == serving and res.method == "yukino"
    probs = [s.probability for s in res.results[0].top_k]
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)


def negation_accuracy(client: Client, method: str) -> float:
    """One shape: "a photo of a {its colour} shape and no {other} shape." against the same caption
    with the two colours exchanged (a negation swap; plain cosine prefers the wrong one, since both
    captions name the colour that is there)."""
    colour_pairs = itertools.permutations(("red", "blue", "green", "yellow"), 2)
    cases = [(shape, c1, c2) for c1, c2 in colour_pairs for shape in ("circle", "square", "triangle", "cross")
             if seen_combo(c1, shape)]  # fmt: skip
    hits = 0
    for shape, c1, c2 in cases:
        true, swapped = (f"a photo of a {a} shape and no {b} shape." for a, b in ((c1, c2), (c2, c1)))
        encoder = "base" if method == "standard" else None
        res = client.classify([draw(shape, c1, 0.2)], [swapped, true], templates=["{}"], method=method, encoder=encoder)
        hits += res.labels[0] == true
    return hits / len(cases)


def test_yukino_reads_negation_where_cosine_does_not(client: Client) -> None:
    yukino, cosine = negation_accuracy(client, "yukino"), negation_accuracy(client, "standard")
    print(f"true caption over its negation swap: yukino {yukino:.3f}, plain cosine {cosine:.3f}")
    assert yukino >= 0.7 and cosine <= 0.5


def test_yukino_reads_colour_binding_where_cosine_does_not(client: Client) -> None:
    pairs = list(itertools.permutations(COLOUR_NAMES, 2))[::3]  # every third ordered pair: ~80 scenes
    yukino = colour_swap_accuracy(client, None, "yukino", pairs)
    cosine = colour_swap_accuracy(client, "base", colour_pairs=pairs)
    print(f"true caption over its colour swap: yukino {yukino:.3f}, plain cosine {cosine:.3f}")
    assert yukino >= 0.65 and yukino > cosine + 0.1


def test_comparative_changes_only_the_targeted_label(client: Client) -> None:
    labels = list(SHAPES)
    images = [draw("circle", "red", 0.2), draw("square", "green", 0.2), draw("cross", "orange", 0.15)]
    text = "a circle is round with no corners, while a square has four straight sides and four corners"
    standard = client.classify(images, labels, top_k=len(labels))
    corrected = client.classify(
        images, labels, top_k=len(labels), comparative=True, comparatives=[{"a": "circle", "b": "square", "text": text}]
    )
    info = corrected.comparative
    assert info is not None and info.applied and info.source == "request"
    assert [tuple(p) for p in info.pairs] == [("circle", "square")] and info.alpha == pytest.approx(0.9)
    for before, after in zip(standard.results, corrected.results, strict=True):
        for label in labels:
            old, new = before.score(label), after.score(label)
            assert old is not None and new is not None
            if label == "square":
                assert abs(new.cosine - old.cosine) > 1e-4, "the targeted label's prompts must change"
            else:
                assert new.cosine == pytest.approx(old.cosine, abs=1e-6), label


def test_comparative_symmetric_also_moves_the_source_label(client: Client) -> None:
    labels = ["circle", "square", "triangle"]
    image = [draw("triangle", "yellow", 0.2)]
    comp = [("circle", "square", "a circle is round, while a square has corners")]
    standard = client.classify(image, labels, top_k=3).results[0]
    both = client.classify(image, labels, top_k=3, comparative=True, comparatives=comp, symmetric=True).results[0]
    assert both.score("triangle").cosine == pytest.approx(standard.score("triangle").cosine, abs=1e-6)
    for label in ("circle", "square"):
        assert abs(both.score(label).cosine - standard.score(label).cosine) > 1e-4


def test_comparative_library_or_an_honest_fallback(client: Client) -> None:
    images = [draw("circle", "red", 0.2)]
    labels = list(SHAPES)
    standard = client.classify(images, labels, top_k=5).results[0]
    res = client.classify(images, labels, top_k=5, comparative=True)
    assert res.comparative is not None
    if res.comparative.applied:
        assert res.comparative.source == "library" and res.comparative.pairs
    else:
        # No library entry for these labels: standard prompts, and the response says so.
        assert res.comparative.source == "none"
        assert [s.cosine for s in res.results[0].top_k] == pytest.approx([s.cosine for s in standard.top_k], abs=1e-6)


# ----------------------------------------------------------------------------- embed + references
def test_embed_dims_ids_and_sha256_references(client: Client, serving: str) -> None:
    big, small = draw("diamond", "green", 0.22), draw("diamond", "green", 0.09)
    emb = client.embed_images([big, small])
    assert emb.model == serving and emb.dim > 0
    assert len(emb.embeddings) == 2 and all(len(e) == emb.dim for e in emb.embeddings)
    assert all(math.isclose(math.sqrt(sum(v * v for v in e)), 1.0, abs_tol=1e-3) for e in emb.embeddings)
    assert emb.ids == [image_id(big), image_id(small)]
    texts = client.embed_texts(["a red circle", "a blue square"])
    assert texts.dim == emb.dim and texts.ids == [image_sha256(t.encode()) for t in ("a red circle", "a blue square")]

    by_data = client.rank_pair(big, small, LARGER)
    by_ref = client.rank_pair(ImageRef.sha256(emb.ids[0]), {"sha256": emb.ids[1]}, LARGER)
    mixed = client.rank_pair(small, ImageRef.sha256(emb.ids[0]), LARGER)
    assert by_ref.first == by_data.first and by_ref.score == pytest.approx(by_data.score, abs=1e-5)
    assert mixed.score == pytest.approx(-by_data.score, abs=1e-5)
    with pytest.raises(NotFound) as info:
        client.rank_pair(ImageRef.sha256("0" * 64), small, LARGER)
    assert info.value.code == "unknown_image"


def test_embed_as_numpy_equals_the_float_answer(client: Client) -> None:
    images = [draw("circle", "red"), draw("square", "blue", 0.12)]
    packed = client.embed_images(images, as_numpy=True)
    assert isinstance(packed.embeddings, np.ndarray) and packed.embeddings.dtype == np.float32
    assert packed.embeddings.shape == (2, packed.dim)
    np.testing.assert_array_equal(packed.embeddings, client.embed_images(images).as_numpy())  # float32 both ways


def test_dense_scores_and_heatmap_png(client: Client, sdk_server: str, serving: str) -> None:
    scene, text = draw("circle", "red"), "a red circle"
    dense = client.score_dense(scene, [text, "a blue square"], return_maps=True)
    assert dense.model == serving and dense.best == 0 and dense.tokens is not None
    png = client.dense_heatmap(scene, text)
    raw = httpx.post(f"{sdk_server}/score/dense/heatmap", json={"image": image_input(scene), "text": text}, timeout=60)
    assert raw.status_code == 200 and png == raw.content  # the server's picture, byte for byte
    picture = Image.open(io.BytesIO(png))
    tokens = len(dense.tokens[0])  # docs/api.md gives the picture's size from the token count
    assert picture.format == "PNG" and picture.width == 8 + 192 + 8 + min(tokens, 8) * 72
    with pytest.raises(NotFound) as info:
        client.dense_heatmap(scene, text, model="default@no-such-version")
    assert info.value.status == 404


# ----------------------------------------------------------------------------- async client
async def test_async_client_concurrent_calls_match_sequential_ones(sdk_server: str, client: Client) -> None:
    images = [draw(shape, "purple" if shape != "diamond" else "cyan", 0.2) for shape in SHAPES]
    sequential = [client.classify([im], list(SHAPES), top_k=2) for im in images]
    async with AsyncClient(sdk_server, timeout=120) as aclient:
        concurrent = await asyncio.gather(*(aclient.classify([im], list(SHAPES), top_k=2) for im in images))
    for seq, con in zip(sequential, concurrent, strict=True):
        assert con.labels == seq.labels
        expected = [s.cosine for s in seq.results[0].top_k]
        assert [s.cosine for s in con.results[0].top_k] == pytest.approx(expected, abs=1e-6)
