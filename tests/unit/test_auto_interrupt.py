"""``auto``'s timing stops as soon as ``interrupted`` says so: no further call is timed, and a
selection that is interrupted decides and keeps nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipcore.backends import auto
from clipcore.backends.base import ServingTowers


class Counting:
    """An image encoder that counts its calls and says ``stop`` after ``after`` of them."""

    def __init__(self, after: int) -> None:
        self.calls, self.after = 0, after

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.zeros((len(batch), 4), dtype=np.float32)

    def stop(self) -> bool:
        return self.calls >= self.after


def test_timing_stops_at_the_next_call_once_interrupted() -> None:
    encoder = Counting(after=5)
    with pytest.raises(auto.TimingInterrupted):
        auto.time_rounds([encoder, encoder], 8, seconds=3600.0, interrupted=encoder.stop)
    assert encoder.calls == 5  # not one call after it said so, whatever the rounds had left


def test_an_interrupted_selection_keeps_no_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": [("torch", "fp32"), ("onnx", "fp32")])
    built: list[tuple[str, str]] = []

    class Bundle:
        name, version, ref, image_size = "tiny", "v1", "tiny@v1", 8

    def build(backend: str, precision: str) -> Any:
        built.append((backend, precision))
        towers = ServingTowers.__new__(ServingTowers)
        towers.encode_images = Counting(after=0)  # type: ignore[method-assign]
        return towers, f"{backend} {precision}"

    monkeypatch.setattr(auto, "decision_path", lambda root, *args, **kwargs: root / "auto" / "tiny" / "v1.json")
    asked = iter([False, True])  # the first candidate is built, then a request arrives
    with pytest.raises(auto.TimingInterrupted):
        auto.fastest_towers(Bundle(), build, device="cpu", cache_root=tmp_path, threads=None,  # type: ignore[arg-type]
                            interrupted=lambda: next(asked, True))  # fmt: skip
    assert built == [("torch", "fp32")]
    assert not (tmp_path / "auto").exists()
