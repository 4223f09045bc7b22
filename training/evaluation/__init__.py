"""Evaluation of a model version: ``world`` on held-out shapes-world data (docs/design.md,
section 4), ``userdata`` on a user's own labelled images and captions (docs/data.md). The names
below are the shapes world's evaluation."""

from training.evaluation.world.base import EvalConfig, generator_images, pil_images
from training.evaluation.world.run import Evaluator, evaluate

__all__ = ["EvalConfig", "Evaluator", "evaluate", "generator_images", "pil_images"]
