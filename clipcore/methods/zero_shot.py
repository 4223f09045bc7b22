"""Zero-shot classification with prompt ensembling (numpy only).

Notation: ``g(I)`` and ``f(T)`` are the L2-normalised image and text embeddings. Label ``c`` has
prompts ``p`` (templates filled with the label name, or free descriptions); its class embedding
is ``f_c = normalize(mean_p f(p))`` and the logits are ``logit_scale * g(I) . f_c``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.common import (
    as_float_array,
    check_finite_scalar,
    check_int,
    l2_normalize,
    softmax,
)

__all__ = [
    "DEFAULT_TEMPLATES",
    "class_embeddings",
    "expand_prompts",
    "top_k",
    "zero_shot_logits",
    "zero_shot_probs",
]

# Generic enough for rendered shapes ("a drawing of a red circle.") and for real photos.
DEFAULT_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a {}.",
    "an image of a {}.",
    "a picture of a {}.",
    "a drawing of a {}.",
)


def expand_prompts(
    label: str,
    templates: Sequence[str],
    descriptions: Sequence[str] | None = None,
) -> list[str]:
    """Build the prompts of one label: every template filled with ``label``, then descriptions.

    Each template must contain exactly one ``{}``, which is replaced by the label (plain string
    replacement, so other braces in a template are kept literally). Free descriptions (for
    example "a shape with three corners") are appended unchanged; averaging many phrasings of
    the same class gives a more robust class embedding than any single prompt.

    Raises:
        ValueError: on an empty label, a template without exactly one ``{}``, an empty
            description, or when no prompt at all would be produced.
    """
    if not isinstance(label, str) or not label.strip():
        raise ValueError("label must be a non-empty string")
    if isinstance(templates, str):
        raise ValueError("templates must be a sequence of strings, not a single string")
    prompts: list[str] = []
    for template in templates:
        if not isinstance(template, str) or template.count("{}") != 1:
            raise ValueError("template must contain exactly one {}")
        prompts.append(template.replace("{}", label))
    if descriptions is not None:
        if isinstance(descriptions, str):
            raise ValueError("descriptions must be a sequence of strings, not a single string")
        for description in descriptions:
            if not isinstance(description, str) or not description.strip():
                raise ValueError("descriptions must be non-empty strings")
            prompts.append(description)
    if not prompts:
        raise ValueError(f"label {label!r} has no templates and no descriptions")
    return prompts


def class_embeddings(prompt_embeddings: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Average each class's prompt embeddings and re-normalise: ``f_c = normalize(mean_p f(p))``.

    Args:
        prompt_embeddings: one ``(P_c, D)`` array per class, rows already L2-normalised;
            ``P_c`` may differ between classes but ``D`` may not. A ``(C, P, D)`` array (every
            class with ``P`` prompts, the usual case) is averaged in one vectorised step.

    Returns:
        ``(C, D)`` array of unit-norm class embeddings, in input order.

    The mean of unit vectors is shorter than one, so it is normalised again to make
    ``g . f_c`` a cosine. Should the prompts of a class cancel exactly, its row stays zero.

    Raises:
        ValueError: on no classes, a class without prompts, or inconsistent dimensions.
    """
    if len(prompt_embeddings) == 0:
        raise ValueError("prompt_embeddings must hold at least one class")
    if isinstance(prompt_embeddings, np.ndarray) and prompt_embeddings.ndim == 3:
        arr = as_float_array(prompt_embeddings, "prompt_embeddings", ndim=3)
        if arr.shape[1] == 0:
            raise ValueError("class 0 has no prompt embeddings")
        return l2_normalize(arr.mean(axis=1), axis=-1)
    means: list[np.ndarray] = []
    dim: int | None = None
    for c, emb in enumerate(prompt_embeddings):
        arr = as_float_array(emb, f"prompt_embeddings[{c}]", ndim=2)
        if arr.shape[0] == 0:
            raise ValueError(f"class {c} has no prompt embeddings")
        if dim is None:
            dim = arr.shape[1]
        elif arr.shape[1] != dim:
            raise ValueError(f"class {c} has dimension {arr.shape[1]}, expected {dim}")
        means.append(arr.mean(axis=0))
    return l2_normalize(np.stack(means, axis=0), axis=-1)


def _check_pair(image_emb: np.ndarray, class_emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    img = as_float_array(image_emb, "image_emb", ndim=2)
    cls = as_float_array(class_emb, "class_emb", ndim=2)
    if img.shape[1] != cls.shape[1]:
        raise ValueError(f"image_emb dimension {img.shape[1]} does not match class_emb dimension {cls.shape[1]}")
    if cls.shape[0] == 0:
        raise ValueError("class_emb must hold at least one class")
    return img, cls


def zero_shot_logits(image_emb: np.ndarray, class_emb: np.ndarray, logit_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Score images against classes: ``cosine = g . f_c`` and ``logits = logit_scale * cosine``.

    Args:
        image_emb: ``(N, D)`` L2-normalised image embeddings ``g(I)``.
        class_emb: ``(C, D)`` L2-normalised class embeddings ``f_c``.
        logit_scale: the model's learned inverse temperature (``exp`` of the stored
            parameter, about 100 for released CLIP models); must be positive.

    Returns:
        ``(logits, cosine)``, both ``(N, C)``. Inputs are not re-normalised, so the outputs
        equal the formula exactly for the vectors given.

    Raises:
        ValueError: on mismatched shapes or a non-positive / non-finite ``logit_scale``.
    """
    scale = check_finite_scalar(logit_scale, "logit_scale", low=0.0, low_inclusive=False)
    img, cls = _check_pair(image_emb, class_emb)
    cosine = img @ cls.T
    return cosine * np.asarray(scale, dtype=cosine.dtype), cosine


def zero_shot_probs(image_emb: np.ndarray, class_emb: np.ndarray, logit_scale: float) -> np.ndarray:
    """Class probabilities ``softmax_c(logit_scale * g . f_c)``, shape ``(N, C)``.

    Raises:
        ValueError: as :func:`zero_shot_logits`.
    """
    logits, _ = zero_shot_logits(image_emb, class_emb, logit_scale)
    return softmax(logits, axis=-1)


def top_k(probs: np.ndarray, cosine: np.ndarray, labels: Sequence[str], k: int) -> list[tuple[str, float, float]]:
    """Return the ``k`` most probable ``(label, prob, cosine)`` triples of one image.

    Sorted by probability, highest first; equal probabilities keep label order (stable sort),
    so the answer is deterministic. ``k`` larger than the number of classes is clipped.

    Raises:
        ValueError: if ``probs``/``cosine`` are not ``(C,)`` matching ``labels``, or ``k < 1``.
    """
    k = check_int(k, "k", low=1)
    p = as_float_array(probs, "probs", ndim=1)
    cos = as_float_array(cosine, "cosine", ndim=1)
    if p.shape != cos.shape or p.shape[0] != len(labels):
        raise ValueError(f"probs {p.shape}, cosine {cos.shape} and labels ({len(labels)}) must have the same length")
    order = np.argsort(-p, kind="stable")[:k]
    return [(labels[i], float(p[i]), float(cos[i])) for i in order]
