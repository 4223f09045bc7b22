"""DCSM dense scoring: token x patch cosine maps, functional rows, a small CNN scorer (torch).

A map ``M[t, p] = cos(text token t, image token p)`` covers every text position up to a fixed
length L (padding rows are 0) and every image token (class token first, then the patches in
row-major grid order). Each map is z-scored on its own, so a score never depends on what
else shares the batch. Functional words ("left", "not", ...) carry no visual content, so
their rows are replaced by fixed random vectors: one row per group, synonyms share it. The
scorer turns a prepared map into one scalar; it is trained with a symmetric cross-entropy
over candidate sets that contain hard negatives.

Pure: tensors in, tensors out, no I/O, inputs are never modified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULT_LENGTH",
    "DEFAULT_SCORER_CONFIG",
    "FUNCTIONAL_GROUPS",
    "NEGATION_WORDS",
    "DCSMScorer",
    "candidate_pairs",
    "dcsm_scores",
    "finish_maps",
    "functional_row_table",
    "place_functional_rows",
    "prepare_maps",
    "similarity_map",
    "zscore_map",
]

DEFAULT_LENGTH = 30

# Words that negate, as the tokenizer splits them ("isn't" is "isn" + "'t"): the phrasings of
# docs/negation.md share one row, so a negation the scorer met in one phrasing reads the same in another.
NEGATION_WORDS: tuple[str, ...] = ("not", "no", "without", "absent", "missing", "lacking", "lacks", "devoid",
                                   "free", "isn", "doesn", "cannot", "never", "none", "nothing", "nowhere")  # fmt: skip

# Group -> words. Every word of a group gets the group's row. A trained scorer keeps the groups it
# was trained with (its config), so widening a group here changes only scorers trained after.
FUNCTIONAL_GROUPS: dict[str, tuple[str, ...]] = {
    "left": ("left",),
    "right": ("right",),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
    "negation": NEGATION_WORDS,
    "contrast": ("but",),
    "small": ("small", "little", "tiny"),
    "big": ("big", "large", "huge"),
}

DEFAULT_SCORER_CONFIG: dict[str, Any] = {
    "layout": "grid",  # or "reference": the map as a 1-channel (L, 1+P) image
    "length": DEFAULT_LENGTH,
    "grid": 8,
    "channels": 32,
    "cls_features": 32,
    "hidden": 128,
    "dropout": 0.1,  # on the head's hidden layer
    "input_dropout": 0.0,  # on the flattened conv features (costly: a mask per feature)
    "ref_channels": [4, 4],
    "ref_pool": False,
}


def functional_row_table(groups: Sequence[str] | Mapping[str, Any], n_positions: int, seed: int) -> torch.Tensor:
    """(G, n_positions) fixed N(0, 1) rows, one per group; row i is the i-th group by name.

    z-scored maps are roughly N(0, 1) too, so a functional row looks like a map row in
    scale but is unmistakable in pattern.
    """
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(len(groups), int(n_positions), generator=gen)


def similarity_map(img_tok: torch.Tensor, txt_tok: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, L, 1+P) cosines of every text position with every image token; invalid rows 0."""
    return _cosines(img_tok, txt_tok) * valid[:, :, None].float()


def _cosines(img_tok: torch.Tensor, txt_tok: torch.Tensor, normalised: bool = False) -> torch.Tensor:
    # Dividing the dot products by the norms avoids writing normalised copies of the inputs.
    img, txt = img_tok.float(), txt_tok.float()
    dots = torch.matmul(txt, img.transpose(-1, -2))
    if normalised:
        return dots
    norms = txt.norm(dim=-1).clamp(min=1e-8)[..., :, None] * img.norm(dim=-1).clamp(min=1e-8)[..., None, :]
    return dots / norms


def zscore_map(sim: torch.Tensor, valid: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Each map standardised over its own valid rows (all columns); other rows become 0."""
    # Row sums first, then one pass to write the result: the maps are the largest tensors of
    # a training step and every full pass over them costs as much as a conv layer.
    w = valid.to(sim.dtype)
    count = (w.sum(-1) * sim.shape[-1]).clamp(min=1.0)
    mean = (sim.sum(-1) * w).sum(-1) / count
    var = (torch.linalg.vector_norm(sim, dim=-1).square() * w).sum(-1) / count - mean * mean
    scale = torch.rsqrt(var.clamp(min=0.0) + eps)
    return (sim - mean[:, None, None]).mul_(scale[:, None, None] * w[:, :, None])


def place_functional_rows(sim: torch.Tensor, row_index: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A copy of ``sim`` whose rows with ``row_index >= 0`` are the table's row of that group."""
    return _put_rows_(sim.clone(), row_index, table)


def _put_rows_(out: torch.Tensor, row_index: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    hit = row_index >= 0
    if bool(hit.any()):
        out[hit] = table.to(device=out.device, dtype=out.dtype)[row_index[hit]]
    return out


def prepare_maps(
    img_tok: torch.Tensor, txt_tok: torch.Tensor, valid: torch.Tensor, row_index: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    """Similarity -> per-map z-score -> functional rows: the scorer's input (B, L, 1+P)."""
    return finish_maps(_cosines(img_tok, txt_tok), valid, row_index, table)


def finish_maps(sim: torch.Tensor, valid: torch.Tensor, row_index: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Raw cosine maps (B, L, 1+P) -> z-scored maps with functional rows in place.

    The z-score statistics leave the functional positions out: their raw cosines carry no
    meaning and are replaced anyway.
    """
    ordinary = valid & (row_index < 0)
    z = zscore_map(sim, ordinary)  # a fresh tensor: the rows can go in without a copy
    return _put_rows_(z, torch.where(valid, row_index, torch.full_like(row_index, -1)), table)


class DCSMScorer(nn.Module):
    """Scores one prepared map with a small CNN.

    ``grid`` layout (default): the patch columns are reshaped to the image's patch grid with
    text positions as input channels, so convolutions see neighbouring patches (what spatial
    relations and attribute binding are about); two conv layers, then the flattened grid
    plus the class-token column (through a linear layer) go to an MLP head.
    ``reference`` layout: the whole (L, 1+P) map as a one-channel image, as in the original
    method; kept for comparison.
    """

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        cfg = {**DEFAULT_SCORER_CONFIG, **dict(config or {})}
        self.config = cfg
        self.layout = str(cfg["layout"])
        length, grid, hidden, p = int(cfg["length"]), int(cfg["grid"]), int(cfg["hidden"]), float(cfg["dropout"])
        self.length, self.grid = length, grid
        if self.layout == "grid":
            c = int(cfg["channels"])
            # ReLU, not GELU: on CPU the erf of the large conv activations cost as much as the convs.
            self.convs = nn.Sequential(
                nn.Conv2d(length, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU()
            )
            self.cls = nn.Linear(length, int(cfg["cls_features"]))
            features = c * grid * grid + int(cfg["cls_features"])
        elif self.layout == "reference":
            c1, c2 = (int(x) for x in cfg["ref_channels"])
            layers: list[nn.Module] = [nn.Conv2d(1, c1, 3, padding=1), nn.ReLU()]
            rows, cols = length, 1 + grid * grid
            if cfg["ref_pool"]:
                layers.append(nn.MaxPool2d(2))
                rows, cols = rows // 2, cols // 2
            layers += [nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU()]
            self.convs = nn.Sequential(*layers)
            features = c2 * rows * cols
        else:
            raise ValueError(f"unknown scorer layout {self.layout!r}")
        self.head = nn.Sequential(
            nn.Dropout(float(cfg["input_dropout"])), nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(p),
            nn.Linear(hidden, 1),
        )  # fmt: skip

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        b, length, n = maps.shape
        if length != self.length or n != 1 + self.grid * self.grid:
            raise ValueError(f"maps must be (B, {self.length}, {1 + self.grid**2}), got {tuple(maps.shape)}")
        if self.layout == "grid":
            patches = maps[:, :, 1:].reshape(b, length, self.grid, self.grid)
            # Channels-last (text positions innermost) is 2-3x faster for these convs on CPU.
            x = self.convs(patches.contiguous(memory_format=torch.channels_last)).flatten(1)
            x = torch.cat([x, F.relu(self.cls(maps[:, :, 0]))], dim=1)
        else:
            x = self.convs(maps[:, None]).flatten(1)
        return self.head(x).squeeze(-1)


def dcsm_scores(scorer: DCSMScorer, maps: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """(B,) scores of prepared maps, in chunks (the scorer has no cross-sample state)."""
    if maps.shape[0] <= chunk:
        return scorer(maps)
    return torch.cat([scorer(maps[i : i + chunk]) for i in range(0, maps.shape[0], chunk)])


def candidate_pairs(n_pairs: int, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(2n, 2 + k) candidate anchor ids for every anchor.

    Anchors are interleaved: ``2i`` is item i's (image, caption), ``2i + 1`` its hard negative
    (the negative caption with the image it is true of); each is the other's hard negative.
    Columns: the anchor itself, its hard negative, then k random anchors of other items.
    """
    if n_pairs < 2 and k > 0:
        raise ValueError("random candidates need at least two items in the batch")
    anchors = torch.arange(2 * n_pairs)
    cols = [anchors[:, None], (anchors ^ 1)[:, None]]
    if k > 0:
        item = (anchors // 2)[:, None]
        shift = torch.randint(1, n_pairs, (2 * n_pairs, k), generator=generator)
        member = torch.randint(0, 2, (2 * n_pairs, k), generator=generator)
        cols.append(2 * ((item + shift) % n_pairs) + member)
    return torch.cat(cols, dim=1)
