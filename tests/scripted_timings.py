"""Timings that decide ``precision=auto`` the same way on every machine, for tests about what is
done with a decision (shared, remembered, served), not about which backend is faster here.

The real interleaved rounds still run (every candidate is built and called, as in production),
but their figures are replaced: the reference and every other candidate time 10 images/s, the
ONNX candidates 200, 400, ... in their order (on a CPU the last is ONNX int8). The winner and its
margin are then the script's, never the ratio of two real kernels on a busy machine (the tiny
model's ONNX int8 and fp32 towers are within each other's noise on 2 shared cores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from clipcore.backends import auto
from clipcore.backends.onnx import OnnxTowers

REAL_TIME_ROUNDS = auto.time_rounds
OTHERS_IMAGES_PER_S = 10.0
ONNX_IMAGES_PER_S = 200.0


def _is_onnx(encode: Callable[[np.ndarray], np.ndarray]) -> bool:
    return isinstance(getattr(getattr(encode, "__self__", None), "pooled", None), OnnxTowers)


def onnx_scripted_to_win(
    encoders: Sequence[Callable[[np.ndarray], np.ndarray]],
    image_size: int,
    seconds: float,
    rounds: int = auto.ROUNDS,
    batch_sizes: Sequence[int] = auto.TIMED_BATCHES,
    **optional: Any,
) -> list[list[dict[str, float]]]:
    """The real rounds' shape with scripted figures: the last ONNX candidate wins by 2x, every
    ONNX candidate beats the others by 20x or more, with no spread between rounds."""
    real = REAL_TIME_ROUNDS(encoders, image_size, seconds, rounds, batch_sizes)
    scripted: list[list[dict[str, float]]] = []
    onnx_seen = 0
    for encode, per_round in zip(encoders, real, strict=True):
        figure = OTHERS_IMAGES_PER_S
        if _is_onnx(encode):
            figure = ONNX_IMAGES_PER_S * 2**onnx_seen
            onnx_seen += 1
        scripted.append([dict.fromkeys(measured, figure) for measured in per_round])
    return scripted
