"""The resume check every method's tests share: stopped, resumed, and the same weights."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

SMOKE = Path(__file__).resolve().parents[3] / "training" / "configs" / "shapes-smoke.json"


def assert_same_state(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol)


def resumes_to_the_uninterrupted_result(
    run: Callable[..., Mapping[str, torch.Tensor]], tmp_path: Path, stop: int, atol: float = 1e-6
) -> list[str]:
    """``run(checkpoints, log)`` trained uninterrupted, and stopped after ``stop`` steps then
    resumed from its checkpoint, end with the same weights; the resumed run's log."""
    from training.methods.checkpoint import Checkpoints

    whole = run(Checkpoints(), lambda _: None)
    path = tmp_path / "run.checkpoint.pt"
    run(Checkpoints(path, every=2, stop_after=stop), lambda _: None)
    assert path.exists()
    saved = torch.load(path, weights_only=False)
    assert saved["step"] == stop
    logs: list[str] = []
    resumed = run(Checkpoints(path, every=2), logs.append)
    assert_same_state(whole, resumed, atol)
    return logs
