"""Evaluation of a model version, laid out as training is: ``methods`` holds each method's figures
once (``zero_shot``, ``comparatives``, ``pcclip``, ``dcsm``, ``semclip``, ``yukino``, ``retrieval``), computed from
embeddings and scores that a data source hands it; ``world`` (held-out shapes-world data,
docs/design.md, section 4) and ``userdata`` (a user's own labelled images and captions,
docs/data.md) build those inputs from their own records and run the methods. The names below are
the shapes world's evaluation.

They load on first use (PEP 562): the world's evaluation brings torch and open_clip, and the
table printers under ``userdata`` (``clip-train show-eval``) need neither."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.evaluation.world.base import EvalConfig, generator_images, pil_images
    from training.evaluation.world.run import Evaluator, evaluate

_HOMES = {
    "EvalConfig": "training.evaluation.world.base",
    "generator_images": "training.evaluation.world.base",
    "pil_images": "training.evaluation.world.base",
    "Evaluator": "training.evaluation.world.run",
    "evaluate": "training.evaluation.world.run",
}
__all__ = ["EvalConfig", "Evaluator", "evaluate", "generator_images", "pil_images"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
