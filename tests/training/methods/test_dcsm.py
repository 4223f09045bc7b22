"""DCSM (``training.methods.dcsm``) on synthetic dense features: both step losses (the shapes
world's in-batch pairs, a user's caption negatives) fall and fit what they train on, and a stopped
run resumes to the uninterrupted result with either."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from resume_checks import resumes_to_the_uninterrupted_result

from clipcore.methods.dcsm import functional_row_table
from training.methods import dcsm
from training.methods.checkpoint import Checkpoints, Runtime

N, LENGTH, POSITIONS, DIM = 24, 6, 17, 16  # items, text positions, 1 + 4x4 patches, feature width
CONFIG = dcsm.scorer_config(POSITIONS, {"negation": ["no"]}, 0, channels=4, hidden=16, length=LENGTH)
TABLE = functional_row_table(CONFIG["functional_groups"], POSITIONS, 0)


def texts(n: int, gen: torch.Generator) -> dcsm.DenseTexts:
    rows = torch.full((n, LENGTH), -1, dtype=torch.long)
    return dcsm.DenseTexts(torch.randn(n, LENGTH, DIM, generator=gen).half(), torch.ones(n, LENGTH, dtype=torch.bool),
                           rows)  # fmt: skip


def caption_negatives(hyper: dcsm.Hyper) -> dcsm.StepLoss:
    """Each image shares its patches with its caption's tokens (plus noise); text rows N.. are
    hard negatives, unrelated to any image."""
    gen = torch.Generator().manual_seed(0)
    all_texts = texts(2 * N, gen)
    images = torch.randn(N, POSITIONS, DIM, generator=gen)
    images[:, 1 : 1 + LENGTH] = all_texts.tokens[:N].float() + 0.3 * torch.randn(N, LENGTH, DIM, generator=gen)
    return dcsm.caption_negatives(images.half(), all_texts, torch.arange(N), [[N + i] for i in range(N)], TABLE,
                                  hyper, batch_size=8, seed=0, device="cpu")  # fmt: skip


def in_batch_pairs(hyper: dcsm.Hyper) -> dcsm.StepLoss:
    """Rows 2i / 2i+1: item i's image and caption, and its hard negative's."""
    gen = torch.Generator().manual_seed(1)
    all_texts = texts(2 * N, gen)
    images = torch.randn(2 * N, POSITIONS, DIM, generator=gen)
    images[:, 1 : 1 + LENGTH] = all_texts.tokens.float() + 0.3 * torch.randn(2 * N, LENGTH, DIM, generator=gen)
    items = dcsm.DenseItems(images.half(), all_texts, torch.arange(2 * N), ["swap"] * N)
    return dcsm.in_batch_pairs(items, TABLE, hyper, batch_size=6, steps_per_epoch=N // 6, seed=0, device="cpu")


def train(step_loss: dcsm.StepLoss, hyper: dcsm.Hyper, checkpoints: Checkpoints, log: Callable[[str], None]) -> dict:
    state, _ = dcsm.train(CONFIG, step_loss, hyper, runtime=Runtime(log=log), checkpoints=checkpoints)
    return state


@pytest.mark.slow  # tens of optimisation steps
def test_both_step_losses_fall_and_fit_what_they_train_on() -> None:
    for make in (caption_negatives, in_batch_pairs):
        hyper = dcsm.Hyper(steps=60, lr=5e-3, warmup_steps=5)
        _, history = dcsm.train(CONFIG, make(hyper), hyper, runtime=Runtime(), checkpoints=Checkpoints())
        first, last = history[:10], history[-10:]
        mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        assert mean(last, "loss") < mean(first, "loss") - 0.2, make.__name__
        assert mean(last, "fit") > mean(first, "fit"), make.__name__


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    hyper = dcsm.Hyper(steps=8, lr=2e-3, warmup_steps=2)
    for name, make in (("user", caption_negatives), ("world", in_batch_pairs)):
        # in_batch_pairs: 4 steps an epoch, so the stop falls inside the second epoch.
        logs = resumes_to_the_uninterrupted_result(lambda c, log, m=make: train(m(hyper), hyper, c, log),
                                                   tmp_path / name, stop=5)  # fmt: skip
        assert "dcsm: resumed from step 5" in logs
