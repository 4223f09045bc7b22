import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clipcore.methods.zero_shot import (
    DEFAULT_TEMPLATES,
    class_embeddings,
    expand_prompts,
    top_k,
    zero_shot_logits,
    zero_shot_probs,
)

INV_SQRT2 = 0.70710678


def test_default_templates_each_have_one_slot():
    assert len(DEFAULT_TEMPLATES) >= 3
    assert all(t.count("{}") == 1 for t in DEFAULT_TEMPLATES)


def test_expand_prompts_templates_then_descriptions():
    out = expand_prompts("circle", ("a photo of a {}.", "a {}."), ["a round shape"])
    assert out == ["a photo of a circle.", "a circle.", "a round shape"]


def test_expand_prompts_keeps_other_braces_literally():
    assert expand_prompts("square", ["{x} a {}"]) == ["{x} a square"]


@pytest.mark.parametrize("template", ["a photo", "a {} and a {}"])
def test_expand_prompts_rejects_bad_templates(template):
    with pytest.raises(ValueError, match=r"exactly one \{\}"):
        expand_prompts("circle", [template])


@pytest.mark.parametrize(
    "label, templates, descriptions",
    [("", ["a {}."], None), ("circle", [], None), ("circle", [], [""]), ("c", "a {}.", None)],
)
def test_expand_prompts_rejects_bad_input(label, templates, descriptions):
    with pytest.raises(ValueError):
        expand_prompts(label, templates, descriptions)


def test_class_embeddings_mean_then_normalise():
    prompts = [
        np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32),  # mean (0.5, 0.5)
        np.array([[0.6, 0.8]], dtype=np.float32),
    ]
    copies = [p.copy() for p in prompts]
    out = class_embeddings(prompts)
    np.testing.assert_allclose(out, [[INV_SQRT2, INV_SQRT2], [0.6, 0.8]], atol=1e-6)
    assert out.shape == (2, 2) and out.dtype == np.float32
    for p, c in zip(prompts, copies):
        np.testing.assert_array_equal(p, c)


def test_class_embeddings_of_a_stacked_array_equal_the_per_class_path():
    rng = np.random.default_rng(3)
    stacked = rng.normal(size=(7, 5, 16)).astype(np.float32)
    out = class_embeddings(stacked)
    np.testing.assert_allclose(out, class_embeddings(list(stacked)), atol=1e-7)
    np.testing.assert_allclose(out[2], stacked[2].mean(0) / np.linalg.norm(stacked[2].mean(0)), atol=1e-6)
    assert out.shape == (7, 16) and out.dtype == np.float32


@pytest.mark.parametrize(
    "prompts",
    [
        [],
        np.zeros((2, 0, 4), dtype=np.float32),
        [np.zeros((0, 2), dtype=np.float32)],
        [np.ones((1, 2), dtype=np.float32), np.ones((1, 3), dtype=np.float32)],
        [np.ones(2, dtype=np.float32)],
    ],
)
def test_class_embeddings_rejects_bad_shapes(prompts):
    with pytest.raises(ValueError):
        class_embeddings(prompts)


IMAGES = np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
CLASSES = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)


def test_zero_shot_logits_hand_case():
    logits, cosine = zero_shot_logits(IMAGES, CLASSES, logit_scale=2.0)
    np.testing.assert_allclose(cosine, [[1.0, 0.0], [0.6, 0.8]], atol=1e-7)
    np.testing.assert_allclose(logits, [[2.0, 0.0], [1.2, 1.6]], atol=1e-6)


def test_zero_shot_probs_hand_case():
    # row 0: softmax(2, 0); row 1: softmax(1.2, 1.6)
    probs = zero_shot_probs(IMAGES, CLASSES, logit_scale=2.0)
    expected = [[0.88079708, 0.11920292], [0.40131234, 0.59868766]]
    np.testing.assert_allclose(probs, expected, atol=1e-6)


def test_zero_shot_does_not_mutate_inputs():
    img, cls = IMAGES.copy(), CLASSES.copy()
    zero_shot_probs(img, cls, 100.0)
    np.testing.assert_array_equal(img, IMAGES)
    np.testing.assert_array_equal(cls, CLASSES)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_zero_shot_rejects_bad_logit_scale(scale):
    with pytest.raises(ValueError, match="logit_scale"):
        zero_shot_logits(IMAGES, CLASSES, scale)


@pytest.mark.parametrize(
    "image, classes",
    [(IMAGES, np.ones((2, 3), dtype=np.float32)), (IMAGES[0], CLASSES), (IMAGES, CLASSES[:0])],
)
def test_zero_shot_rejects_bad_shapes(image, classes):
    with pytest.raises(ValueError):
        zero_shot_logits(image, classes, 1.0)


def test_top_k_sorted_and_clipped():
    probs = np.array([0.2, 0.5, 0.3], dtype=np.float32)
    cosine = np.array([0.1, 0.3, 0.2], dtype=np.float32)
    top2 = top_k(probs, cosine, ["x", "y", "z"], k=2)
    assert [t[0] for t in top2] == ["y", "z"]
    np.testing.assert_allclose([t[1] for t in top2], [0.5, 0.3])
    np.testing.assert_allclose([t[2] for t in top2], [0.3, 0.2])
    assert all(isinstance(t[1], float) and isinstance(t[2], float) for t in top2)
    assert [t[0] for t in top_k(probs, cosine, ["x", "y", "z"], k=10)] == ["y", "z", "x"]


def test_top_k_ties_keep_label_order():
    out = top_k(np.array([0.4, 0.4, 0.2]), np.zeros(3), ["x", "y", "z"], k=2)
    assert [t[0] for t in out] == ["x", "y"]


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_top_k_rejects_bad_k(k):
    with pytest.raises(ValueError):
        top_k(np.ones(2), np.ones(2), ["a", "b"], k)


def test_top_k_rejects_length_mismatch():
    with pytest.raises(ValueError):
        top_k(np.ones(2), np.ones(2), ["a"], 1)


def test_numpy_modules_do_not_import_torch():
    repo_root = Path(__file__).resolve().parents[3]
    code = (
        "import sys; import clipcore.methods.zero_shot, clipcore.methods.comparative, "
        "clipcore.methods.pairwise_rank; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=repo_root)
