"""Numerical helpers shared by the serving-side method modules (numpy only).

Every function returns a new array and never writes into its input.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "as_float_array",
    "check_finite_scalar",
    "check_int",
    "l2_normalize",
    "quantize",
    "softmax",
    "truncate_dimensions",
]


def as_float_array(x: np.ndarray, name: str, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` as a floating-point ndarray, checking its rank.

    Floating inputs keep their dtype (no copy is made, so callers must not write into the
    result); anything else is converted to float32, the serving dtype.

    Raises:
        ValueError: if ``x`` is not numeric or does not have ``ndim`` dimensions.
    """
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
            raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
        arr = arr.astype(np.float32)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    return arr


def check_finite_scalar(
    value: float, name: str, *, low: float | None = None, high: float | None = None, low_inclusive: bool = True
) -> float:
    """Return ``value`` as a float after checking it is finite and inside ``[low, high]``.

    ``low_inclusive=False`` makes the lower bound strict (``value > low``).

    Raises:
        ValueError: if the value is not a finite real number or lies outside the bounds.
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if low is not None and (v < low or (v == low and not low_inclusive)):
        op = ">=" if low_inclusive else ">"
        raise ValueError(f"{name} must be {op} {low}, got {v}")
    if high is not None and v > high:
        raise ValueError(f"{name} must be <= {high}, got {v}")
    return v


def check_int(value: int, name: str, *, low: int | None = None) -> int:
    """Return ``value`` as an int after checking it is an integer (not a bool) ``>= low``.

    Raises:
        ValueError: if the value is not an integer or is below ``low``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def l2_normalize(x: np.ndarray, axis: int = -1, eps: float = 1e-12) -> np.ndarray:
    """L2-normalise ``x`` along ``axis``: ``x / max(||x||_2, eps)``.

    CLIP compares embeddings by cosine, so every vector is projected onto the unit sphere
    before a dot product. Dividing by ``max(norm, eps)`` instead of ``norm`` keeps an all-zero
    vector at zero rather than producing NaN.

    Raises:
        ValueError: if ``eps`` is not positive or ``axis`` is out of range.
    """
    check_finite_scalar(eps, "eps", low=0.0, low_inclusive=False)
    arr = as_float_array(x, "x")
    if arr.ndim == 0:
        raise ValueError("x must have at least one dimension")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of rank {arr.ndim}")
    norm = np.linalg.norm(arr, axis=axis, keepdims=True)
    return arr / np.maximum(norm, np.asarray(eps, dtype=arr.dtype))


def truncate_dimensions(x: np.ndarray, dims: int) -> np.ndarray:
    """The first ``dims`` components of each row of ``x``, L2-normalised again (Matryoshka-style
    shortening, as OpenAI's ``dimensions`` parameter does).

    How much a shortened vector keeps depends on the model: one trained with a Matryoshka loss
    packs the most information into the leading components; a plain CLIP model does not, and its
    shortened vectors lose more. ``dims`` equal to the width returns the rows normalised.

    Raises:
        ValueError: if ``x`` is not 2-D or ``dims`` is not in ``1..x.shape[1]``.
    """
    arr = as_float_array(x, "x", ndim=2)
    check_int(dims, "dims", low=1)
    if dims > arr.shape[1]:
        raise ValueError(f"dims must be <= {arr.shape[1]} (the embedding width), got {dims}")
    return l2_normalize(arr[:, :dims])


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: ``exp(z - max z) / sum exp(z - max z)`` along ``axis``.

    Subtracting the maximum leaves the result unchanged (it cancels between numerator and
    denominator) but keeps ``exp`` from overflowing for large logits such as
    ``logit_scale = 100`` times a cosine.

    Raises:
        ValueError: if ``axis`` is out of range.
    """
    arr = as_float_array(logits, "logits")
    if arr.ndim == 0:
        raise ValueError("logits must have at least one dimension")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of rank {arr.ndim}")
    if arr.shape[axis] == 0:
        raise ValueError("softmax needs at least one logit along the axis")
    shifted = arr - np.max(arr, axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / np.sum(exp, axis=axis, keepdims=True)


def quantize(array: np.ndarray) -> np.ndarray:
    """``array`` as served: rounded to float16 (the embedding cache's format) and back, read-only.
    Every answer is computed from such values, so it never depends on whether they were cached."""
    arr = np.asarray(array, dtype=np.float16).astype(np.float32)
    arr.setflags(write=False)
    return arr
