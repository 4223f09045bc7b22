import itertools

import numpy as np
import pytest

from clipcore.methods.pairwise_rank import pair_decision, pair_scores, rank_images

F = np.array([0.6, 0.8], dtype=np.float32)


def test_pair_scores_hand_case_and_sign_flip():
    g_a = np.array([[1.0, 0.0]], dtype=np.float32)
    g_b = np.array([[0.0, 1.0]], dtype=np.float32)
    # normalize((1, -1)) . (0.6, 0.8) = -0.2 / sqrt(2)
    np.testing.assert_allclose(pair_scores(g_a, g_b, F), [-0.14142136], atol=1e-6)
    np.testing.assert_allclose(pair_scores(g_b, g_a, F), [0.14142136], atol=1e-6)


def test_pair_scores_per_pair_texts():
    g_a = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    g_b = np.array([[0.0, 1.0], [0.0, 1.0]], dtype=np.float32)
    texts = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    np.testing.assert_allclose(pair_scores(g_a, g_b, texts), [0.70710678, -0.70710678], atol=1e-6)


def test_zero_difference_scores_zero_not_nan():
    g = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    h = np.array([[0.6, 0.8], [0.0, 1.0]], dtype=np.float32)
    out = pair_scores(g, h, F)
    assert np.all(np.isfinite(out))
    assert out[0] == 0.0
    np.testing.assert_allclose(out[1], -0.14142136, atol=1e-6)


def test_tiny_difference_does_not_underflow():
    g_a = np.array([[1e-30, 0.0]], dtype=np.float32)
    g_b = np.zeros((1, 2), dtype=np.float32)
    np.testing.assert_allclose(pair_scores(g_a, g_b, np.array([1.0, 0.0])), [1.0], atol=1e-6)


def test_pair_scores_does_not_mutate_inputs():
    g_a = np.array([[1.0, 0.0]], dtype=np.float32)
    g_b = np.array([[0.0, 1.0]], dtype=np.float32)
    f = F.copy()
    pair_scores(g_a, g_b, f)
    np.testing.assert_array_equal(g_a, [[1.0, 0.0]])
    np.testing.assert_array_equal(g_b, [[0.0, 1.0]])
    np.testing.assert_array_equal(f, F)


@pytest.mark.parametrize(
    "g_a, g_b, f_t",
    [
        (np.ones((2, 2)), np.ones((3, 2)), F),
        (np.ones((2, 2)), np.ones((2, 2)), np.ones(3)),
        (np.ones((2, 2)), np.ones((2, 2)), np.ones((3, 2))),
        (np.ones(2), np.ones(2), F),
        (np.ones((1, 0)), np.ones((1, 0)), np.ones(0)),
    ],
)
def test_pair_scores_rejects_bad_shapes(g_a, g_b, f_t):
    with pytest.raises(ValueError):
        pair_scores(g_a, g_b, f_t)


def test_pair_decision():
    assert pair_decision(0.3) == "a"
    assert pair_decision(-0.3) == "b"
    assert pair_decision(0.0) == "a"
    with pytest.raises(ValueError):
        pair_decision(float("nan"))


def test_rank_images_hand_case():
    g = np.array([[0.0, 1.0], [1.0, 0.0], [0.6, 0.8]], dtype=np.float32)
    order, scores = rank_images(g, np.array([1.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(order, [1, 2, 0])
    np.testing.assert_allclose(scores, [0.0, 1.0, 0.6], atol=1e-7)


def test_rank_images_ties_keep_input_order():
    g = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    order, _ = rank_images(g, np.array([1.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(order, [0, 2, 1])


def test_rank_order_agrees_with_every_pairwise_decision():
    rng = np.random.default_rng(1234)
    g = rng.normal(size=(12, 8)).astype(np.float32)
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    f = rng.normal(size=8).astype(np.float32)
    f /= np.linalg.norm(f)
    order, _ = rank_images(g, f)
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    pairs = list(itertools.permutations(range(len(g)), 2))
    idx_a = np.array([i for i, _ in pairs])
    idx_b = np.array([j for _, j in pairs])
    scores = pair_scores(g[idx_a], g[idx_b], f)
    for (i, j), s in zip(pairs, scores):
        expected = "a" if position[i] < position[j] else "b"
        assert pair_decision(float(s)) == expected, (i, j, s)


@pytest.mark.parametrize(
    "g, f_t",
    [(np.ones((2, 2)), np.ones(3)), (np.ones(2), np.ones(2)), (np.ones((2, 2)), np.ones((1, 2)))],
)
def test_rank_images_rejects_bad_shapes(g, f_t):
    with pytest.raises(ValueError):
        rank_images(g, f_t)
