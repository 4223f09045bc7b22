import numpy as np
import pytest

from clipcore.methods.comparative import (
    affected_classes,
    apply_comparatives,
    confused_pairs,
    gated_probs,
    margin,
)

E2 = np.eye(2, dtype=np.float32)
E3 = np.eye(3, dtype=np.float32)


def test_alpha_half_update_of_target_only():
    # f_a - d = (1, 0) - (0, -1) = (1, 1); 0.5 * (0, 1) + 0.5 * (1, 1) = (0.5, 1) -> /sqrt(1.25)
    d = np.array([0.0, -1.0], dtype=np.float32)
    out = apply_comparatives(E2, [(0, 1, d)], alpha=0.5)
    np.testing.assert_allclose(out[1], [0.4472136, 0.89442719], atol=1e-6)
    np.testing.assert_array_equal(out[0], E2[0])
    assert out.dtype == np.float32


def test_symmetric_update_hand_case():
    # b: 0.5 * (0, 1) + 0.5 * ((1, 0) - d) = (0.2, 0.9) -> /sqrt(0.85)
    # a: 0.5 * (1, 0) + 0.5 * ((0, 1) + d) = (0.8, 0.1) -> /sqrt(0.65)
    d = np.array([0.6, -0.8], dtype=np.float32)
    out = apply_comparatives(E2, [(0, 1, d)], alpha=0.5, symmetric=True)
    np.testing.assert_allclose(out[1], [0.21693046, 0.97618706], atol=1e-6)
    np.testing.assert_allclose(out[0], [0.99227788, 0.12403473], atol=1e-6)


def test_updates_use_original_embeddings_and_average_per_target():
    d01 = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    d12 = np.array([0.0, 0.0, -1.0], dtype=np.float32)
    comps = [(0, 1, d01), (1, 2, d12)]
    out = apply_comparatives(E3, comps, alpha=0.5, symmetric=True)
    # class 1: mean(e0 - d01, e2 + d12) = (0.5, 0, -0.5); mixed (0.25, 0.5, -0.25)
    np.testing.assert_allclose(out[1], [0.40824829, 0.81649658, -0.40824829], atol=1e-6)
    # class 0 (symmetric): e1 + d01 = (0, 1, 1); mixed (0.5, 0.5, 0.5)
    np.testing.assert_allclose(out[0], [0.57735027] * 3, atol=1e-6)
    # class 2: e1 - d12 = (0, 1, 1) from the ORIGINAL e1; mixed (0, 0.5, 1)
    np.testing.assert_allclose(out[2], [0.0, 0.4472136, 0.89442719], atol=1e-6)
    reversed_out = apply_comparatives(E3, comps[::-1], alpha=0.5, symmetric=True)
    np.testing.assert_allclose(reversed_out, out, atol=1e-7)


def test_two_comparatives_on_one_target_are_averaged():
    d1 = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    d2 = np.array([0.0, 0.0, -1.0], dtype=np.float32)
    # mean(e0 - d1, e1 - d2) = (0.5, 0.5, 0); alpha=0 keeps only that -> (1, 1, 0)/sqrt(2)
    out = apply_comparatives(E3, [(0, 2, d1), (1, 2, d2)], alpha=0.0)
    np.testing.assert_allclose(out[2], [0.70710678, 0.70710678, 0.0], atol=1e-6)
    np.testing.assert_array_equal(out[:2], E3[:2])


def test_untouched_rows_bit_identical_and_inputs_not_mutated():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(4, 5)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    d = rng.normal(size=5).astype(np.float32)
    emb_before, d_before = emb.copy(), d.copy()
    out = apply_comparatives(emb, [(0, 2, d)], alpha=0.9)
    for c in (0, 1, 3):
        assert out[c].tobytes() == emb[c].tobytes()
    assert not np.array_equal(out[2], emb[2])
    np.testing.assert_array_equal(emb, emb_before)
    np.testing.assert_array_equal(d, d_before)
    assert out is not emb


def test_no_comparatives_returns_a_copy():
    out = apply_comparatives(E2, [])
    np.testing.assert_array_equal(out, E2)
    assert out is not E2


@pytest.mark.parametrize(
    "comps, alpha",
    [
        ([(0, 1, np.zeros(2))], 1.5),
        ([(0, 1, np.zeros(2))], -0.1),
        ([(0, 0, np.zeros(2))], 0.5),
        ([(0, 2, np.zeros(2))], 0.5),
        ([(0, 1, np.zeros(3))], 0.5),
        ([(0, 1)], 0.5),
    ],
)
def test_apply_comparatives_rejects_bad_input(comps, alpha):
    with pytest.raises(ValueError):
        apply_comparatives(E2, comps, alpha=alpha)


def test_affected_classes():
    comps = [(0, 1, np.zeros(2)), (2, 1, np.zeros(2))]
    assert affected_classes(3, comps, symmetric=False) == {1}
    assert affected_classes(3, comps, symmetric=True) == {0, 1, 2}
    assert affected_classes(3, [], symmetric=True) == set()
    with pytest.raises(ValueError):
        affected_classes(2, comps, symmetric=False)


STD = np.array([[0.7, 0.2, 0.1], [0.4, 0.35, 0.25]], dtype=np.float32)
COMP = np.array([[0.6, 0.3, 0.1], [0.3, 0.6, 0.1]], dtype=np.float32)


def test_margin_hand_case():
    np.testing.assert_allclose(margin(STD), [0.5, 0.05], atol=1e-6)
    np.testing.assert_array_equal(margin(np.array([[0.5, 0.5]])), [0.0])
    with pytest.raises(ValueError):
        margin(np.ones((2, 1)))


def test_gated_probs_mask():
    std_before, comp_before = STD.copy(), COMP.copy()
    probs, applied = gated_probs(STD, COMP, gate_margin=0.1)
    np.testing.assert_array_equal(applied, [False, True])
    np.testing.assert_array_equal(probs, [STD[0], COMP[1]])
    np.testing.assert_array_equal(STD, std_before)
    np.testing.assert_array_equal(COMP, comp_before)


def test_gated_probs_none_and_zero():
    probs, applied = gated_probs(STD, COMP, gate_margin=None)
    np.testing.assert_array_equal(probs, COMP)
    assert applied.dtype == bool and applied.all()
    probs, applied = gated_probs(STD, COMP, gate_margin=0.0)
    np.testing.assert_array_equal(probs, STD)
    assert not applied.any()


@pytest.mark.parametrize("gate", [-0.1, float("nan")])
def test_gated_probs_rejects_bad_gate(gate):
    with pytest.raises(ValueError):
        gated_probs(STD, COMP, gate)


def test_gated_probs_rejects_shape_mismatch():
    with pytest.raises(ValueError):
        gated_probs(STD, COMP[:1], 0.1)


def test_confused_pairs_counts_both_directions_with_ties():
    pairs = [(2, 3), (2, 3), (3, 2), (0, 1), (0, 1), (1, 0), (0, 2), (1, 3), (0, 0), (3, 3)]
    y_true = np.array([t for t, _ in pairs])
    y_pred = np.array([p for _, p in pairs])
    # (0,1) and (2,3) tie at 3 -> (a, b) order; (0,2) and (1,3) tie at 1
    assert confused_pairs(y_true, y_pred, num_classes=4, k=3) == [(0, 1, 3), (2, 3, 3), (0, 2, 1)]
    assert confused_pairs(y_true, y_pred, num_classes=4, k=10) == [
        (0, 1, 3),
        (2, 3, 3),
        (0, 2, 1),
        (1, 3, 1),
    ]
    assert confused_pairs(y_true, y_pred, num_classes=4, k=0) == []


def test_confused_pairs_perfect_predictions_give_nothing():
    y = np.array([0, 1, 2])
    assert confused_pairs(y, y, num_classes=3, k=5) == []


@pytest.mark.parametrize(
    "y_true, y_pred, num_classes, k",
    [
        (np.array([0, 1]), np.array([0]), 2, 1),
        (np.array([0, 2]), np.array([0, 1]), 2, 1),
        (np.array([0.0, 1.0]), np.array([0, 1]), 2, 1),
        (np.array([0, -1]), np.array([0, 1]), 2, 1),
        (np.array([0, 1]), np.array([0, 1]), 0, 1),
        (np.array([0, 1]), np.array([0, 1]), 2, -1),
    ],
)
def test_confused_pairs_rejects_bad_input(y_true, y_pred, num_classes, k):
    with pytest.raises(ValueError):
        confused_pairs(y_true, y_pred, num_classes, k)
