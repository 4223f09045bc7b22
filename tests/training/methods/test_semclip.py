"""SemCLIP (``training.methods.semclip``) on synthetic image features and a real tiny CLIP's text
tower: its loss falls, the ablation weights switch terms off, and a stopped run resumes to the
uninterrupted result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from resume_checks import resumes_to_the_uninterrupted_result

from clipcore.methods.losses import semclip_loss
from clipcore.methods.semclip import projection_directions
from clipcore.models.clip_model import normalize, text_features
from training.encode import Tokenize
from training.methods import semclip
from training.methods.checkpoint import Checkpoints, Runtime

WORDS = ("circle", "square", "star", "cross", "ring", "heart", "moon", "arrow")


def data() -> semclip.TripletData:
    images = torch.nn.functional.normalize(torch.randn(16, 32, generator=torch.Generator().manual_seed(0)), dim=-1)
    words = [WORDS[i % len(WORDS)] for i in range(16)]
    return semclip.TripletData(images, [f"a photo of a {w}" for w in words], [f"an image of a {w}" for w in words],
                               [f"a photo of no {w}" for w in words])  # fmt: skip


def rows(step: int) -> np.ndarray:
    return np.random.default_rng([0, step, 31]).choice(16, size=8, replace=False)


def train(tiny: torch.nn.Module, hyper: semclip.Hyper, checkpoints: Checkpoints, log: Callable[[str], None]) -> dict:
    state, _ = semclip.train(tiny, data(), rows, hyper, tokenize=Tokenize(32), scale=10.0,  # type: ignore[arg-type]
                             runtime=Runtime(log=log), checkpoints=checkpoints)  # fmt: skip
    return state


def loss_parts(model: torch.nn.Module, weights: tuple[float, float, float]) -> tuple[float, dict[str, float]]:
    d = data()
    directions = torch.from_numpy(projection_directions(32, 2, 0))
    with torch.no_grad():
        t, tp, tn = (normalize(text_features(model, Tokenize(32)(x))[0].float())  # type: ignore[arg-type]
                     for x in (d.original, d.paraphrase, d.negation))  # fmt: skip
        loss, parts = semclip_loss(d.images, t, tp, tn, directions, 10.0, weights, True, True)
    return float(loss), parts


@pytest.mark.slow  # tens of optimisation steps
def test_the_loss_falls_on_what_it_trains_on(tiny: torch.nn.Module) -> None:
    import copy

    after = copy.deepcopy(tiny)
    after.load_state_dict(train(tiny, semclip.Hyper(steps=40, lr=2e-3), Checkpoints(), print))
    assert loss_parts(after, (1.0, 1.0, 1.0))[0] < loss_parts(tiny, (1.0, 1.0, 1.0))[0] - 0.2


@pytest.mark.slow  # tens of optimisation steps
def test_each_ablation_lowers_the_term_it_weights(tiny: torch.nn.Module) -> None:
    import copy

    for weights, term in (((1.0, 0.0, 1.0), "neg"), ((1.0, 1.0, 0.0), "para")):
        after = copy.deepcopy(tiny)
        after.load_state_dict(train(tiny, semclip.Hyper(steps=30, lr=2e-3, weights=weights), Checkpoints(), print))
        assert loss_parts(after, weights)[1][term] < loss_parts(tiny, weights)[1][term] - 0.05, term


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tiny: torch.nn.Module, tmp_path: Path) -> None:
    hyper = semclip.Hyper(steps=6, lr=1e-3)
    logs = resumes_to_the_uninterrupted_result(lambda c, log: train(tiny, hyper, c, log), tmp_path, stop=3)
    assert "semclip: resumed from step 3" in logs
