"""YUKINO matching and the Winoground-style figures (numpy).

An image is represented in text space by its pseudo-token prompts: ``yes = f("a photo of $")``
and ``no = f("a photo of no $")``. A caption's score is how much better the "yes" form matches
it than the "no" form, ``cos(yes, c) - cos(no, c)``: a caption matches the image whose "yes" form
outscores the "no" forms, and of several captions the highest score wins.
"""

from __future__ import annotations

import numpy as np


def yes_no_scores(yes: np.ndarray, no: np.ndarray, captions: np.ndarray) -> np.ndarray:
    """``(N, D)`` yes and no prompt features of N images, ``(M, D)`` normalised caption
    embeddings -> ``(N, M)`` scores ``yes @ c - no @ c``."""
    if yes.shape != no.shape or yes.ndim != 2 or captions.ndim != 2 or yes.shape[1] != captions.shape[1]:
        raise ValueError(f"shapes do not fit: yes {yes.shape}, no {no.shape}, captions {captions.shape}")
    return (yes - no) @ captions.T


def paired_yes_no_scores(yes: np.ndarray, no: np.ndarray, captions: np.ndarray) -> np.ndarray:
    """Row ``i``'s score for caption ``i`` only: the diagonal of ``yes_no_scores``, shape ``(N,)``."""
    if not yes.shape == no.shape == captions.shape or yes.ndim != 2:
        raise ValueError(f"shapes do not fit: yes {yes.shape}, no {no.shape}, captions {captions.shape}")
    return np.sum((yes - no) * captions, axis=1)


def winoground(s00: np.ndarray, s01: np.ndarray, s10: np.ndarray, s11: np.ndarray) -> dict[str, np.ndarray]:
    """Per 2x2 item, with ``sIJ`` = score(image I, caption J) and caption J true of image J:
    text (each image prefers its caption), image (each caption prefers its image), group (both)."""
    text = (s00 > s01) & (s11 > s10)
    image = (s00 > s10) & (s11 > s01)
    return {"text": text, "image": image, "group": text & image}


__all__ = ["paired_yes_no_scores", "winoground", "yes_no_scores"]
