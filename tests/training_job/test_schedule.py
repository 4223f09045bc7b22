"""The one learning-rate schedule: both warm-ups, the plain cosine and the base recipe's second phase."""

from __future__ import annotations

import math

import pytest

from training.schedule import lr_at


def test_warmup_then_cosine_reaches_the_peak_and_decays_over_the_rest() -> None:
    rates = [lr_at(s, lr=1.0, steps=110, warmup_steps=10) for s in range(110)]
    assert rates[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert rates[10] == 1.0 and rates[60] == pytest.approx(0.5) and rates[-1] < 1e-3


def test_overlapping_warmup_multiplies_a_cosine_over_every_step() -> None:
    for step in (0, 5, 19, 20, 70):
        expected = min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / 100))
        assert lr_at(step, lr=1.0, steps=100, warmup_steps=20, warmup="overlap") == expected


def test_no_warmup_is_a_plain_cosine_and_phase_two_is_constant() -> None:
    assert [lr_at(s, lr=2.0, steps=4) for s in range(4)] == [
        2.0 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)
    ]
    assert lr_at(0, lr=2.0, steps=4, warmup="overlap") == 2.0
    assert lr_at(50, lr=1.0, steps=100, warmup_steps=10, phase2_start=40, phase2_lr_frac=0.1) == 0.1
