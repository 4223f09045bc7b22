import numpy as np
import pytest

from clipcore.methods.common import (
    as_float_array,
    check_finite_scalar,
    check_int,
    l2_normalize,
    softmax,
    truncate_dimensions,
)


def test_l2_normalize_rows_and_zero_row():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    before = x.copy()
    out = l2_normalize(x)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(x, before)


def test_l2_normalize_axis0():
    out = l2_normalize(np.array([[3.0], [4.0]]), axis=0)
    np.testing.assert_allclose(out, [[0.6], [0.8]])


def test_l2_normalize_integer_input_becomes_float32():
    out = l2_normalize(np.array([0, 2]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0.0, 1.0])


@pytest.mark.parametrize("kwargs", [{"eps": 0.0}, {"eps": -1.0}, {"axis": 2}])
def test_l2_normalize_rejects_bad_params(kwargs):
    with pytest.raises(ValueError):
        l2_normalize(np.ones((2, 2), dtype=np.float32), **kwargs)


def test_softmax_hand_case():
    # exp(0) : exp(ln 3) = 1 : 3
    np.testing.assert_allclose(softmax(np.array([0.0, np.log(3.0)])), [0.25, 0.75])


def test_softmax_is_stable_for_large_logits():
    out = softmax(np.array([[1000.0, 1000.0], [1000.0, -1000.0]], dtype=np.float32))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [[0.5, 0.5], [1.0, 0.0]])


def test_softmax_axis0_and_no_mutation():
    x = np.array([[0.0, 1.0], [np.log(3.0), 1.0]])
    before = x.copy()
    np.testing.assert_allclose(softmax(x, axis=0), [[0.25, 0.5], [0.75, 0.5]])
    np.testing.assert_array_equal(x, before)


def test_softmax_rejects_empty_axis():
    with pytest.raises(ValueError):
        softmax(np.zeros((2, 0)))


def test_scalar_and_int_checks():
    assert check_finite_scalar(0.5, "x", low=0.0, high=1.0) == 0.5
    with pytest.raises(ValueError):
        check_finite_scalar(float("nan"), "x")
    with pytest.raises(ValueError):
        check_finite_scalar(0.0, "x", low=0.0, low_inclusive=False)
    with pytest.raises(ValueError):
        check_finite_scalar("abc", "x")
    assert check_int(np.int64(3), "k", low=1) == 3
    with pytest.raises(ValueError):
        check_int(True, "k")
    with pytest.raises(ValueError):
        check_int(1.0, "k")


def test_as_float_array_rank_and_dtype_checks():
    with pytest.raises(ValueError, match="2 dimension"):
        as_float_array(np.zeros(3), "x", ndim=2)
    with pytest.raises(ValueError, match="numeric"):
        as_float_array(np.array(["a"]), "x")


def test_truncate_dimensions_keeps_leading_components_and_renormalises() -> None:
    x = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    out = truncate_dimensions(x, 2)
    np.testing.assert_allclose(out, [[0.6, 0.8], [1.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(x, [[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]])  # input untouched
    np.testing.assert_allclose(truncate_dimensions(x, 3), l2_normalize(x))


@pytest.mark.parametrize("dims", [0, 4])
def test_truncate_dimensions_refuses_out_of_range(dims: int) -> None:
    with pytest.raises(ValueError, match="dims"):
        truncate_dimensions(np.ones((2, 3), dtype=np.float32), dims)
