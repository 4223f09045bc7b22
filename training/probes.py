"""Zero-shot attribute probes on single-object scenes (used while training and in evaluation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.zero_shot import class_embeddings, zero_shot_logits
from clipcore.models.preprocess import PreprocessConfig
from training.encode import Tokenize, encode_images, encode_texts
from training.world.render import render_batch
from training.world.scene import Scene, Split, sample_scene
from training.world.vocab import COLOUR_NAMES, SHAPES

# Label names and the prompt templates each attribute is probed with.
ATTRIBUTE_PROMPTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "shape": (SHAPES, ("a photo of a {}.", "a {}.", "an image of a {}.")),
    "colour": (COLOUR_NAMES, ("a photo of a {} shape.", "a {} shape.", "an image of a {} shape.")),
    "size": (("small", "large"), ("a photo of a {} shape.", "a {} shape.", "an image of a {} shape.")),
}


@dataclass
class ProbeSet:
    scenes: list[Scene]
    images: np.ndarray


def probe_set(split: Split, seed: int, n: int, size: int = 64) -> ProbeSet:
    """``n`` single-object scenes of ``split``, rendered at ``size`` px without jitter."""
    scenes = [sample_scene(split, seed, i, n_objects=1) for i in range(n)]
    return ProbeSet(scenes, render_batch(scenes, size, seed=None))


def attribute_classifier(model: CLIP, tokenize: Tokenize, attribute: str, device: str = "cpu") -> np.ndarray:
    labels, templates = ATTRIBUTE_PROMPTS[attribute]
    prompts = [[t.format(label) for t in templates] for label in labels]
    flat = encode_texts(model, tokenize, [p for group in prompts for p in group], device=device).numpy()
    k = len(templates)
    return class_embeddings([flat[i * k : (i + 1) * k] for i in range(len(labels))])


def zero_shot_accuracy(
    model: CLIP,
    tokenize: Tokenize,
    probes: ProbeSet,
    preprocess: PreprocessConfig,
    image_emb: torch.Tensor | None = None,
    device: str = "cpu",
) -> dict[str, float]:
    """Per-attribute zero-shot accuracy; size is scored on small vs large objects only."""
    if image_emb is None:
        image_emb = encode_images(model, preprocess, probes.images, device=device)
    emb = image_emb.numpy()
    result = {}
    for attribute, (labels, _) in ATTRIBUTE_PROMPTS.items():
        truth = [getattr(s.objects[0], attribute) for s in probes.scenes]
        keep = np.array([t in labels for t in truth])
        classes = attribute_classifier(model, tokenize, attribute, device)
        logits, _ = zero_shot_logits(emb[keep], classes, 1.0)
        pred = np.asarray(labels)[logits.argmax(axis=1)]
        result[attribute] = float(np.mean(pred == np.asarray(truth)[keep]))
    return result
