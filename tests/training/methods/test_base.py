"""Base training (``training.methods.base``) on synthetic batches of a real tiny CLIP: its loss
falls on what it trains on, and a stopped run resumes to the uninterrupted result."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from resume_checks import SMOKE, resumes_to_the_uninterrupted_result

from clipcore.models.clip_model import build_model
from training.encode import Tokenize
from training.from_scratch import image_text_loss
from training.methods import base
from training.methods.checkpoint import Checkpoints, Runtime

CAPTIONS = [f"a photo of a {c} {s}." for c in ("red", "blue") for s in ("circle", "square", "star", "cross")]


def batches(step: int) -> base.Batch:
    """Eight images, each a fixed pattern plus noise drawn from the step, and their captions."""
    gen = torch.Generator().manual_seed(1000 + step)
    patterns = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    images = patterns + 0.1 * torch.randn(8, 3, 64, 64, generator=gen)
    return base.Batch(images, Tokenize(32)(CAPTIONS))


def record(done: int, model: torch.nn.Module, loss: float, history: list[dict[str, Any]], contrastive: float) -> str:
    history.append({"step": done, "loss": loss})
    return f"contrastive loss {contrastive:.3f}"


HYPER = base.Hyper(steps=6, lr=1e-3, warmup_steps=1, text_freeze_steps=2, filip_weight=0.5, checkpoint_every=2)


def train(hyper: base.Hyper, checkpoints: Checkpoints, log: Callable[[str], None]) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(json.loads(SMOKE.read_text()))
    base.train(model, batches, hyper, record=record, checkpoints=checkpoints, runtime=Runtime(log=log))
    return model


@pytest.mark.slow  # tens of optimisation steps
def test_the_image_text_loss_falls_on_what_it_trains_on() -> None:
    batch = batches(0)

    def loss_of(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(image_text_loss(model, batch.images, batch.tokens, filip_weight=0.0, filip=False,
                                         dense=False)[1])  # fmt: skip

    torch.manual_seed(0)
    before = loss_of(build_model(json.loads(SMOKE.read_text())))
    after = loss_of(train(base.Hyper(steps=30, lr=2e-3, warmup_steps=2, text_freeze_steps=10), Checkpoints(), print))
    assert after < before - 0.3, (before, after)


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    logs = resumes_to_the_uninterrupted_result(lambda c, log: train(HYPER, c, log).state_dict(), tmp_path, stop=3)
    assert "base: resumed from step 3" in logs
