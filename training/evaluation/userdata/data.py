"""The evaluation set of a user's dataset: which records, their images embedded once, seeded samples
and the hard negatives of their captions.

Figures are computed on one split of the dataset (``test`` by default; the split of each record is
fixed by its image content, so it never overlaps what training read) or on the whole of a file kept
apart for evaluation (``--split all``). Each evaluation seed draws its own sample of that set (and
its own pairs and presentation orders), so the standard error over seeds says how much a figure
moves with the sample.
"""

from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from clipcore.models.bundle import ModelBundle
from clipcore.models.preprocess import upright
from training.datasets.dataset import Dataset, load_dataset, require_valid
from training.datasets.records import CaptionRecord, LabelRecord, NegativesRecord, PairRecord
from training.datasets.source import ImageRef, Item
from training.generate.differences import article
from training.generate.negatives import attribute_words, hard_negatives

SplitChoice = Literal["train", "val", "test", "all"]
Triple = tuple[int, str, str, str]  # index of the image in the sample, caption, negative, kind


def label_caption(label: str) -> str:
    """The caption a labelled image stands for when a family needs one ("a photo of a shirt.")."""
    return f"a photo of {article(label)} {label}."


@dataclass
class UserEvalConfig:
    seeds: tuple[int, ...] = (0, 1, 2)
    split: SplitChoice = "test"
    n_zeroshot: int = 2000  # labelled images per seed (all of them when the set is smaller)
    n_pairs: int = 1000  # image pairs per seed for pair ranking
    n_captions: int = 300  # captions per seed for DCSM / SemCLIP
    n_yukino: int = 200  # 2x2 items per seed
    n_gallery: int = 500  # labelled images per seed in the retrieval gallery
    rerank_k: int = 100  # first-stage candidates a retrieval's second stage ranks (a search's default k)
    templates: tuple[str, ...] | None = None  # zero-shot prompt templates (None: the service's defaults)
    alpha: float = 0.9  # comparative blending weight, the service's default
    symmetric: bool = False
    gate_margin: float | None = None
    batch_size: int = 256


@dataclass
class EvalSet:
    """The records evaluated and the pooled embedding of every image they name (computed once)."""

    dataset: Dataset
    items: list[Item]
    bundle: ModelBundle
    batch_size: int = 256
    _pooled: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _pixels: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def labelled(self) -> list[Item]:
        return [i for i in self.items if isinstance(i.record, LabelRecord)]

    def images_by_label(self) -> dict[str, list[ImageRef]]:
        """The image of each labelled record, grouped by its label (pairs and 2x2 items draw from it)."""
        grouped: dict[str, list[ImageRef]] = {}
        for item in self.labelled:
            grouped.setdefault(item.record.label, []).append(item.images[0])  # type: ignore[union-attr]
        return grouped

    @property
    def pairs(self) -> list[Item]:
        return [i for i in self.items if isinstance(i.record, PairRecord)]

    def captioned(self) -> list[tuple[Item, str, list[str]]]:
        """(item, caption, the user's own negatives) of every captioned record; labelled images
        count with ``label_caption`` only when the data has no captions at all."""
        out = []
        for item in self.items:
            rec = item.record
            if isinstance(rec, NegativesRecord):
                out.append((item, rec.caption, list(rec.negatives)))
            elif isinstance(rec, CaptionRecord):
                out.append((item, rec.caption, []))
        if not out:
            out = [(i, label_caption(i.record.label), []) for i in self.labelled]  # type: ignore[union-attr]
        return out

    def pixels(self, ref: ImageRef) -> np.ndarray:
        key = _key(ref)
        if key not in self._pixels:
            with Image.open(io.BytesIO(ref.read())) as img:
                self._pixels[key] = self.bundle.preprocess(upright(img))
        return self._pixels[key]

    def embed(self, refs: Sequence[ImageRef]) -> np.ndarray:
        """(N, D) pooled image embeddings, each image encoded once per run."""
        missing = list(dict.fromkeys(_key(r) for r in refs if _key(r) not in self._pooled))
        by_key = {_key(r): r for r in refs}
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            arrays = np.stack([self.pixels(by_key[k]) for k in chunk])
            for k, e in zip(chunk, self.bundle.encode_images(arrays), strict=True):
                self._pooled[k] = e
        return np.stack([self._pooled[_key(r)] for r in refs])


def _key(ref: ImageRef) -> str:
    return str(ref.path) if ref.path is not None else hashlib.sha256(ref.read()).hexdigest()


def load_eval_set(path: Path, bundle: ModelBundle, split: SplitChoice, labels: Path | None = None) -> EvalSet:
    dataset = require_valid(load_dataset(path, labels))
    items = dataset.items if split == "all" else dataset.split(split)
    if not items:
        beside = f": its test part is {dataset.test_file}" if split == "test" and dataset.test_file else ""
        raise ValueError(f"the {split!r} split of {path} has no records{beside} (use --split all for a held-out file)")
    return EvalSet(dataset, items, bundle)


def sample(items: Sequence, n: int, seed: int, salt: int) -> list:
    """``n`` items (all when fewer), drawn by ``seed`` and ``salt`` (one stream per family)."""
    if n >= len(items):
        return list(items)
    return random.Random(seed * 1000 + salt).sample(list(items), n)


def dataset_name(path: Path) -> str:
    """A key-safe name for the dataset: ``folder_stem`` of a file, or the folder's name."""
    path = path.resolve()
    stem = f"{path.parent.name}_{path.stem}" if path.suffix else path.name
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in stem) or "data"


def negative_triples(es: EvalSet, cfg: UserEvalConfig, seed: int) -> tuple[list, list[Triple]]:
    """A seeded sample of the captioned records and, per caption, its hard negatives: one edit each
    (``training.generate.negatives``), the user's own negatives, and for a labelled image another
    label's caption (kind ``label``). DCSM's hard negatives and SemCLIP's negations read the same."""
    picked = sample(es.captioned(), cfg.n_captions, seed, salt=4)
    words = attribute_words(es.dataset.labels)
    triples: list[Triple] = []
    labels = sorted(es.dataset.labels)
    rng = np.random.default_rng([seed, 4])
    for index, (item, caption, own) in enumerate(picked):
        for kind, negative in hard_negatives(caption, words).items():
            triples.append((index, caption, negative, kind))
        triples.extend((index, caption, negative, "user") for negative in own)
        own_label = getattr(item.record, "label", None)
        if own_label is not None and caption == label_caption(own_label):  # a labelled image: another label
            others = [label for label in labels if label != own_label]
            if others:
                triples.append((index, caption, label_caption(others[int(rng.integers(len(others)))]), "label"))
    return picked, triples
