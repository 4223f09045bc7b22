"""SemCLIP math: projection subspace, losses and the evaluation figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clipcore.methods.losses import semclip_loss
from clipcore.methods.semclip import composite_score, original_over_negation, projection_directions, retrieval_top1


def test_projection_directions_are_orthonormal_and_fixed_by_seed() -> None:
    d = projection_directions(64, 2, seed=3)
    assert d.shape == (2, 64)
    np.testing.assert_allclose(d @ d.T, np.eye(2), atol=1e-6)
    np.testing.assert_array_equal(d, projection_directions(64, 2, seed=3))
    assert not np.allclose(d, projection_directions(64, 2, seed=4))
    with pytest.raises(ValueError):
        projection_directions(4, 5)


def test_composite_counts_negation_only_above_chance() -> None:
    assert composite_score(0.6, 0.3, 0.5) == pytest.approx(0.3)
    assert composite_score(0.6, 0.3, 0.2) == pytest.approx(0.3)
    assert composite_score(0.6, 0.3, 1.0) == pytest.approx((0.6 + 0.3 + 1.0) / 3)


def test_orig_over_negation_and_retrieval() -> None:
    images = np.eye(3, dtype=np.float32)
    originals = np.eye(3, dtype=np.float32)
    negations = np.array([[0.0, 1, 0], [0, 1, 0], [1, 0, 0]], dtype=np.float32)
    assert original_over_negation(images, originals, negations).tolist() == [True, False, True]
    assert retrieval_top1(originals[[0, 2, 1]], images).tolist() == [True, False, False]


def _batch(seed: int, n: int = 8, d: int = 16) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_paraphrase_and_negation_terms() -> None:
    directions = torch.from_numpy(projection_directions(16, 2, seed=0))
    img, t = _batch(0), _batch(1)
    _, same = semclip_loss(img, t, t, -t, directions, 10.0)
    assert same["para"] == pytest.approx(0.0, abs=1e-6), "a paraphrase equal to the caption costs nothing"
    assert same["neg"] == pytest.approx(0.0, abs=1e-6), "a negation opposite in the subspace costs nothing"
    _, worst = semclip_loss(img, t, -t, t, directions, 10.0)
    assert worst["para"] == pytest.approx(2.0, abs=1e-5) and worst["neg"] == pytest.approx(1.0, abs=1e-5)


def test_weights_mix_the_terms_and_negatives_in_clip_use_the_negations() -> None:
    directions = torch.from_numpy(projection_directions(16, 2, seed=0))
    img, t, tp, tn = _batch(0), _batch(1), _batch(2), _batch(3)
    loss, parts = semclip_loss(img, t, tp, tn, directions, 10.0, weights=(1.0, 2.0, 0.0))
    assert loss.item() == pytest.approx((parts["clip"] + 2 * parts["para"]) / 3, rel=1e-5)
    # A negation equal to the image is a strong competitor once negations are candidates.
    plain, _ = semclip_loss(img, t, tp, img, directions, 10.0, weights=(1.0, 0.0, 0.0))
    hard, _ = semclip_loss(img, t, tp, img, directions, 10.0, weights=(1.0, 0.0, 0.0), negatives_in_clip=True)
    assert hard.item() > plain.item() + 1.0
    with pytest.raises(ValueError):
        semclip_loss(img, t, tp, tn, directions, 10.0, weights=(0.0, 0.0, 0.0))
    with pytest.raises(ValueError):
        semclip_loss(img, t, tp[:4], tn, directions, 10.0)
