"""Evaluation of a model version, laid out as training is: ``methods`` holds each method's figures
once (``zero_shot``, ``comparatives``, ``pcclip``, ``dcsm``, ``semclip``, ``yukino``), computed from
embeddings and scores that a data source hands it; ``world`` (held-out shapes-world data,
docs/design.md, section 4) and ``userdata`` (a user's own labelled images and captions,
docs/data.md) build those inputs from their own records and run the methods. The names below are
the shapes world's evaluation."""

from training.evaluation.world.base import EvalConfig, generator_images, pil_images
from training.evaluation.world.run import Evaluator, evaluate

__all__ = ["EvalConfig", "Evaluator", "evaluate", "generator_images", "pil_images"]
