"""Evaluation of dense features and DCSM scoring on held-out shapes-world data (2-way wins:
``training.evaluation.methods.dcsm``).

* ``localisation``: for colour and shape words of full captions of 1-2 object TEST scenes,
  the share whose best-matching patch (class token excluded) lies on the named object.
  ``chance`` is what a uniformly random patch would score on the same words.
* ``readout``: training-free checks on the raw maps (no scorer): spatial (where do the two
  noun phrases attend) and binding (do a phrase's colour and shape words attend to the same
  patches). They predict what a scorer can reach, in seconds.
* ``dense_metrics``: 2-way accuracy (the caption against its hard negative for the same
  image) of DCSM and of plain pooled cosine, per kind, on TEST scenes, HELDOUT colour-shape
  combinations and PIL drawings, plus the above; flat keys for ``eval.json``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.token_spans import find_word_spans
from clipcore.models.dense import DCSMHead, DenseEncoder
from clipcore.models.preprocess import fit_square
from training.alignment import patch_masks
from training.evaluation.methods.dcsm import encoder_wins
from training.evaluation.world.base import EvalBase
from training.world.captions import full_caption
from training.world.hard_negatives import KINDS, HardNegative, sample_hard_negative
from training.world.render import draw_scene_pil, render_batch
from training.world.scene import Scene, Split, sample_scene
from training.world.vocab import COLOUR_NAMES, SHAPES

PIL_BACKGROUNDS = ((255, 255, 255), (0, 0, 0), (235, 235, 235), (40, 40, 40))
RELATION_WORDS = {
    "left": "left of",
    "right": "right of",
    "above": "above",
    "over": "above",
    "below": "below",
    "under": "below",
    "beneath": "below",
}
SPAN_OFFSET = 10**6  # evaluation item indices never coincide with training ones


class WordSpans:
    """Positions of vocabulary words in token ids, through the encoder's tokenizer."""

    def __init__(self, encoder: DenseEncoder, words: Sequence[str]) -> None:
        self.encoder = encoder
        self.ids = {w: encoder.tokenizer.encode(w) for w in words}

    def spans(self, text: str) -> list[tuple[int, int, str]]:
        # The text tower sees the start token first: positions count from it.
        ids = [self.encoder.tokenizer.sot_token_id, *self.encoder.tokenizer.encode(text)]
        return find_word_spans(ids, self.ids, self.encoder.word_start_ok(ids))


def _patch_probs(image: torch.Tensor, token: torch.Tensor, temperature: float = 0.05) -> torch.Tensor:
    """Softmax over the patches (class token excluded) of one token's cosines."""
    return torch.softmax(image[1:] @ token / temperature, dim=0)


@torch.no_grad()
def localisation(
    encoder: DenseEncoder, seed: int, n: int = 300, split: Split = Split.TEST, image_size: int = 64
) -> dict[str, float]:
    """Share of colour / shape words whose best patch lies on the named object.

    A patch lies on an object when the object covers at least half as much of it as of the
    object's most covered patch (half the patch for all but the smallest objects, which may
    not fill any patch to half).
    """
    scenes = [sample_scene(split, seed, SPAN_OFFSET + i) for i in range(n)]
    img_tok = encoder.image_tokens(render_batch(scenes, image_size, seed=None))
    text = encoder.text_features([full_caption(s) for s in scenes])
    words = WordSpans(encoder, (*COLOUR_NAMES, *SHAPES))
    grid = math.isqrt(img_tok.shape[1] - 1)
    hits: dict[str, list[float]] = {"colour": [], "shape": []}
    chance: list[float] = []
    for b, scene in enumerate(scenes):
        cover = patch_masks(scene, image_size, grid)  # (objects, P)
        on = cover >= 0.5 * np.minimum(cover.max(axis=1, keepdims=True), 1.0)
        for _, end, word in words.spans(full_caption(scene)):
            if end - 1 >= encoder.length:
                continue
            attribute = "colour" if word in COLOUR_NAMES else "shape"
            owners = [k for k, o in enumerate(scene.objects) if getattr(o, attribute) == word]
            target = np.asarray(on[owners].any(axis=0))
            # The last token of a multi-token word has read the whole word (causal text tower).
            best = int((img_tok[b, 1:] @ text.tokens[b, end - 1]).argmax())
            hits[attribute].append(float(target[best]))
            chance.append(float(np.mean(target)))
    return {
        "colour": float(np.mean(hits["colour"])),
        "shape": float(np.mean(hits["shape"])),
        "chance": float(np.mean(chance)),
    }


def _centroid(probs: torch.Tensor, grid: int) -> tuple[float, float]:
    p = probs.reshape(grid, grid)
    coords = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid
    return float((p.sum(0) * coords).sum()), float((p.sum(1) * coords).sum())  # x, y


def _spatial_score(
    probs: dict[tuple[int, int, str], torch.Tensor], relation: list[tuple[int, int, str]], grid: int
) -> float:
    """How far the attention centroids of the phrases before and after the relation word
    are arranged as the relation says (positive: consistent)."""
    if not relation:
        return 0.0
    cut = relation[0][0]
    before = [p for s, p in probs.items() if s[0] < cut]
    after = [p for s, p in probs.items() if s[0] > cut]
    if not before or not after:
        return 0.0
    (ax, ay), (bx, by) = _centroid(torch.stack(before).sum(0), grid), _centroid(torch.stack(after).sum(0), grid)
    return {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[RELATION_WORDS[relation[0][2]]]


@torch.no_grad()
def readout(encoder: DenseEncoder, items: Sequence[HardNegative], img_tok: torch.Tensor) -> dict[str, float]:
    """Training-free 2-way accuracy from the raw maps (spatial and colour binding items)."""
    attribute_words = WordSpans(encoder, (*COLOUR_NAMES, *SHAPES))
    relation_words = WordSpans(encoder, tuple(RELATION_WORDS))
    grid = math.isqrt(img_tok.shape[1] - 1)
    spatial: list[float] = []
    binding: list[float] = []
    for kind in ("spatial", "binding"):
        chosen = [
            i for i, it in enumerate(items) if it.kind.startswith(kind) and (kind != "binding" or it.detail == "colour")
        ]
        if not chosen:
            continue
        texts = [t for i in chosen for t in (items[i].positive, items[i].negative)]
        feats = encoder.text_features(texts)
        for j, i in enumerate(chosen):
            scores = []
            for row in (2 * j, 2 * j + 1):
                spans = [s for s in attribute_words.spans(texts[row]) if s[1] <= encoder.length]
                probs = {s: _patch_probs(img_tok[i], feats.tokens[row, s[1] - 1]) for s in spans}
                if kind == "spatial":
                    scores.append(_spatial_score(probs, relation_words.spans(texts[row]), grid))
                else:
                    # Adjacent (colour, shape) word pairs: overlap of their patch distributions.
                    overlaps = [
                        float(torch.sqrt(probs[a] * probs[b]).sum())
                        for a, b in pairwise(spans)
                        if a[2] in COLOUR_NAMES and b[2] in SHAPES and b[0] == a[1]
                    ]
                    scores.append(float(np.mean(overlaps)) if overlaps else 0.0)
            (spatial if kind == "spatial" else binding).append(float(scores[0] > scores[1]))
    return {
        "spatial": float(np.mean(spatial)) if spatial else float("nan"),
        "binding": float(np.mean(binding)) if binding else float("nan"),
    }


def _pil_images(scenes: Sequence[Scene], image_size: int) -> np.ndarray:
    """The second renderer at 224 px on flat backgrounds, resized as the service resizes."""
    return np.stack(
        [fit_square(draw_scene_pil(s, 224, PIL_BACKGROUNDS[i % 4]), image_size) for i, s in enumerate(scenes)]
    )


def dense_metrics(
    model: CLIP,
    head: DCSMHead | None,
    seed: int,
    n: int = 300,
    context_length: int | None = None,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    device: str = "cpu",
) -> dict[str, float]:
    """Flat metrics of one evaluation seed; ``n`` items per kind and image source.

    Keys: ``{dcsm,cosine}[.heldout|.pil].{binding,binding_colour,binding_size,spatial_lr,
    spatial_ab,spatial,negation}``, ``readout.{spatial,binding}``,
    ``dense.localisation.{colour,shape,chance}``. Without a head only cosine, readout and
    localisation are computed (the go / no-go check before training a scorer).
    """
    model = model.to(device).eval()
    groups: dict[str, Any] = head.functional_groups if head is not None else {}
    length = int(head.config["length"]) if head is not None else 30
    encoder = DenseEncoder(model, context_length or int(model.context_length), groups, length, mean, std, device)
    image_size = int(model.visual.image_size[0])
    flat: dict[str, float] = {}
    for prefix, split, source in (
        ("", Split.TEST, "generator"),
        ("heldout.", Split.HELDOUT, "generator"),
        ("pil.", Split.TEST, "pil"),
    ):
        items = [sample_hard_negative(split, seed, SPAN_OFFSET + i, kind) for kind in KINDS for i in range(n)]
        scenes = [it.scene for it in items]
        images = (
            render_batch(scenes, image_size, seed=None) if source == "generator" else _pil_images(scenes, image_size)
        )
        wins, img_tok = encoder_wins(
            encoder, head, [it.positive for it in items], [it.negative for it in items], images
        )
        kinds = np.array([it.kind for it in items])
        details = np.array([it.detail for it in items])
        for method, win in wins.items():
            groups_of = {k: kinds == k for k in KINDS}
            groups_of["spatial"] = np.char.startswith(kinds, "spatial")
            groups_of["binding_colour"] = (kinds == "binding") & (details == "colour")
            groups_of["binding_size"] = (kinds == "binding") & (details == "size")
            for name, mask in groups_of.items():
                if mask.any():
                    flat[f"{method}.{prefix}{name}"] = float(win[mask].mean())
        if prefix == "":
            flat.update({f"readout.{k}": v for k, v in readout(encoder, items, img_tok).items()})
    flat.update(
        {f"dense.localisation.{k}": v for k, v in localisation(encoder, seed, n, image_size=image_size).items()}
    )
    return flat


class DenseEval(EvalBase):
    def dense(self, seed: int) -> dict[str, float]:
        """DCSM (when the version has a scorer) and plain cosine on binding, spatial and negation
        hard negatives, plus the localisation of the dense features (``dense_metrics``)."""
        return dense_metrics(
            self.bundle.model,
            getattr(self.bundle, "dcsm", None),
            seed,
            n=self.cfg.n_compositional,
            context_length=self.bundle.context_length,
            mean=self.bundle.mean,
            std=self.bundle.std,
            device=self.bundle.device,
        )
