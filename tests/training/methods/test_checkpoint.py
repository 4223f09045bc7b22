"""The one resume path: where a run ends, when it saves, and which checkpoint it resumes from."""

from __future__ import annotations

from pathlib import Path

import torch

from training.methods.checkpoint import Checkpoints


def test_a_run_ends_at_stop_after_and_saves_every_n_steps_and_at_its_end() -> None:
    checkpoints = Checkpoints(Path("x.pt"), every=4, stop_after=6)
    assert checkpoints.end(10) == 6 and Checkpoints().end(10) == 10
    assert [s for s in range(1, 7) if checkpoints.due(s, 6)] == [4, 6]
    assert not Checkpoints().due(4, 6)  # no path: nothing is ever saved


def test_a_checkpoint_written_under_other_settings_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "m.checkpoint.pt"
    Checkpoints(path, settings={"channels": 8}).save({"step": 3, "weights": torch.ones(2)})
    assert not path.with_suffix(".tmp").exists()  # written whole, then moved in place
    saved = Checkpoints(path, settings={"channels": 8}).load()
    assert saved is not None and saved["step"] == 3 and torch.equal(saved["weights"], torch.ones(2))
    assert Checkpoints(path, settings={"channels": 16}).load() is None
    assert Checkpoints(path).load() is not None  # no settings asked: any checkpoint there
    assert Checkpoints(tmp_path / "none.pt").load() is None
