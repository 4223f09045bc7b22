"""The retrieval math that a collection search and ``clip-train evaluate`` share, on synthetic vectors."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from clipcore.methods.common import l2_normalize
from clipcore.methods.retrieval import (
    chance_recall_at_k,
    cosine_top_k,
    difference_scores,
    order_by_scores,
    recall_at_k,
    reranked,
    sum_scores,
)


def unit(*rows: list[float]) -> np.ndarray:
    return l2_normalize(np.array(rows, dtype=np.float32))


def test_order_is_highest_first_and_ties_keep_their_input_order() -> None:
    assert order_by_scores([0.1, 0.5, 0.5, -1.0, 0.5]).tolist() == [1, 2, 4, 0, 3]


def test_the_first_stage_keeps_the_k_nearest_by_cosine() -> None:
    gallery = unit([1, 0, 0], [0, 1, 0], [0.9, 0.1, 0], [0, 0, 1], [0.7, 0.7, 0])
    assert cosine_top_k(gallery, unit([1, 0, 0])[0], 3).tolist() == [0, 2, 4]
    assert cosine_top_k(gallery, unit([1, 0, 0])[0], 50).tolist() == [0, 2, 4, 1, 3]  # k past the gallery: all
    with pytest.raises(ValueError, match="dimension"):
        cosine_top_k(gallery, np.ones(4), 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        cosine_top_k(gallery, unit([1, 0, 0])[0], 0)


def test_a_second_stage_reorders_the_candidates_and_ties_keep_the_first_stage_order() -> None:
    candidates = np.array([7, 3, 9, 1])
    assert reranked(candidates, [0.2, 0.9, 0.2, 0.5]).tolist() == [3, 1, 7, 9]
    with pytest.raises(ValueError, match="one score each"):
        reranked(candidates, [0.1, 0.2])


def test_the_difference_score_points_from_the_query_to_the_candidate() -> None:
    # "like this one (red circle), but blue": the blue circle's difference from the query is the blue
    # direction minus the red one, and the text points that way; the blue square adds a shape change.
    red, blue, circle, square = np.eye(4, dtype=np.float32)
    query = l2_normalize(red + circle)
    candidates = l2_normalize(np.stack([blue + circle, blue + square, red + circle]))
    text = l2_normalize(blue - red)
    scores = difference_scores(candidates, query, text)
    assert scores[0] == pytest.approx(1.0, abs=1e-6)  # exactly the asked difference
    assert 0 < scores[1] < scores[0]  # the asked difference and another one
    assert scores[2] == 0.0  # the query itself: no difference, no direction, never NaN
    assert order_by_scores(scores)[0] == 0


def test_the_sum_baseline_is_the_cosine_with_the_normalised_sum() -> None:
    red, blue, circle, square = np.eye(4, dtype=np.float32)
    query, text = l2_normalize(red + circle), l2_normalize(blue)
    candidates = l2_normalize(np.stack([blue + circle, red + circle, blue + square]))
    expected = candidates @ l2_normalize(query + text)
    assert np.allclose(sum_scores(candidates, query, text), expected)
    # normalize(g(q) + f(t)) is (red + circle + sqrt(2) blue) / 2: the blue circle shares all three.
    assert sum_scores(candidates, query, text) == pytest.approx([(1 + np.sqrt(2)) / 2 / np.sqrt(2), 1 / np.sqrt(2),
                                                                 np.sqrt(2) / 2 / np.sqrt(2)], abs=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="must both be"):
        sum_scores(candidates, query, np.ones(3))


def test_recall_with_one_right_item_is_whether_it_is_in_the_top_k() -> None:
    ranking = np.array([4, 2, 0, 1, 3])
    relevant = np.array([False, False, True, False, False])
    assert recall_at_k(ranking, relevant, 1) == 0.0
    assert recall_at_k(ranking, relevant, 2) == 1.0


def test_recall_with_more_right_items_than_places_is_precision_at_k() -> None:
    ranking = np.arange(20)
    relevant = np.zeros(20, dtype=bool)
    relevant[[0, 3, 5, 11, 12, 13, 14, 15, 16, 17, 18, 19]] = True  # 12 right items, 3 in the top 10
    assert recall_at_k(ranking, relevant, 10) == pytest.approx(3 / 10)
    assert recall_at_k(ranking, relevant, 1) == 1.0
    relevant[:] = False
    relevant[[1, 15]] = True  # 2 right items: out of 2
    assert recall_at_k(ranking, relevant, 10) == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="at least one right item"):
        recall_at_k(ranking, np.zeros(20, dtype=bool), 10)


def test_chance_is_the_mean_recall_of_random_orders() -> None:
    n, k = 12, 4
    for right in (1, 3, 7):
        # Exact expectation over the hypergeometric number of right items in the top k.
        exact = sum(
            comb(right, h) * comb(n - right, k - h) / comb(n, k) * h / min(k, right) for h in range(min(k, right) + 1)
        )
        assert chance_recall_at_k(n, right, k) == pytest.approx(exact)
    relevant = np.zeros(n, dtype=bool)
    relevant[:3] = True
    rng = np.random.default_rng(0)
    sampled = np.mean([recall_at_k(rng.permutation(n), relevant, k) for _ in range(20000)])
    assert sampled == pytest.approx(chance_recall_at_k(n, 3, k), abs=0.01)
    assert chance_recall_at_k(5, 2, 10) == 1.0  # every item is shown
    with pytest.raises(ValueError, match="exceeds"):
        chance_recall_at_k(5, 6, 1)
