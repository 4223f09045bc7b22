"""The shapes world's PC-CLIP and SemCLIP stages checkpoint in their run directory: a rerun with
the same settings resumes (here from the last step: the same weights, no step trained again), a
rerun with other settings starts over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clipcore.models.clip_model import build_model
from clipcore.models.preprocess import PreprocessConfig
from training.train_pcclip import PCClipConfig, train_pcclip
from training.train_semclip import SemClipConfig, train_semclip

SMOKE = Path(__file__).resolve().parents[2] / "training" / "configs" / "shapes-smoke.json"


@pytest.mark.slow  # renders and encodes the pairs three times
@pytest.mark.parametrize("stage", ["pcclip", "semclip"])
def test_a_rerun_resumes_and_other_settings_start_over(stage: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = build_model(json.loads(SMOKE.read_text())).eval()

    def run(steps: int) -> tuple[dict[str, torch.Tensor], list[str]]:
        logs: list[str] = []
        if stage == "pcclip":
            cfg = PCClipConfig(pairs=32, steps=steps, batch_size=8, checkpoint_every=2)
            state = train_pcclip(base, cfg, tmp_path, logs.append, preprocess=PreprocessConfig())
        else:
            semclip = SemClipConfig(scenes=32, steps=steps, batch_size=8, checkpoint_every=2)
            state = train_semclip(base, semclip, None, tmp_path, logs.append, preprocess=PreprocessConfig())
        return state, logs

    first, _ = run(4)
    assert (tmp_path / f"{stage}.checkpoint.pt").exists()
    again, logs = run(4)
    assert f"{stage}: resumed from step 4" in logs
    assert all(torch.equal(first[k], again[k]) for k in first)
    _, logs = run(6)
    assert not any("resumed" in line for line in logs)
