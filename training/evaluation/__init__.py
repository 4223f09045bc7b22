"""Evaluation of a model version on held-out shapes-world data (docs/design.md, section 4), one
module per method family; ``evaluate`` runs them all."""

from training.evaluation.base import EvalConfig, generator_images, pil_images
from training.evaluation.run import Evaluator, evaluate

__all__ = ["EvalConfig", "Evaluator", "evaluate", "generator_images", "pil_images"]
