"""The learning-rate schedule of every training loop: linear warm-up and cosine decay to zero.

Two warm-ups are in use, and both are kept so that a run gives the same numbers as before:
``then`` (the base CLIP's): the rate climbs to ``lr`` over ``warmup_steps`` and the cosine runs
over the remaining steps; ``overlap`` (the text finetunes' and DCSM's): a warm-up factor multiplies
a cosine that runs over every step. ``warmup_steps=0`` is a plain cosine. The base CLIP's recipe
also has a second phase at a constant fraction of the rate (``phase2_start``).
"""

from __future__ import annotations

import math
from typing import Literal

Warmup = Literal["then", "overlap"]


def lr_at(
    step: int,
    *,
    lr: float,
    steps: int,
    warmup_steps: int = 0,
    warmup: Warmup = "then",
    phase2_start: int | None = None,
    phase2_lr_frac: float = 0.1,
) -> float:
    """The learning rate of ``step`` (0-based) in a schedule of ``steps`` steps."""
    if phase2_start is not None and step >= phase2_start:
        return lr * phase2_lr_frac
    if warmup == "overlap":
        ramp = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
        return lr * ramp * 0.5 * (1 + math.cos(math.pi * step / steps))
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return lr * 0.5 * (1 + math.cos(math.pi * progress))
