"""What every training run on a user's data shares: the validated dataset, the base version, the
device, precision and seed (``training.userdata.device``), the frozen image features
(``training.userdata.features``) and where checkpoints go.

``RunContext.open`` validates the data first (every problem with its file and line, and no
training when there is one), then loads the base version from the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.datasets.dataset import Dataset, load_dataset, require_valid
from training.datasets.records import CaptionRecord, LabelRecord, NegativesRecord
from training.datasets.source import ImageRef, Item
from training.feature_cache import FeatureCache, default_cache_dir
from training.generate.differences import article
from training.methods.checkpoint import Checkpoints, Runtime
from training.userdata.device import Precision, autocast, check_device, resolve_precision, seed_everything
from training.userdata.features import ImageFeatures, Images, Log


def load_valid_dataset(data: Path, labels: Path | None = None) -> Dataset:
    """The dataset, or ``InvalidDataset`` listing every problem (file and line): nothing trains on bad data."""
    return require_valid(load_dataset(data, labels))


@dataclass
class RunContext:
    """A base version, a validated dataset and where features and checkpoints go."""

    store: ModelStore
    bundle: ModelBundle
    dataset: Dataset
    features: ImageFeatures
    run_dir: Path
    device: str = "cpu"
    precision: str = "fp32"
    seed: int = 0
    log: Log = print

    @classmethod
    def open(
        cls,
        store: ModelStore,
        model: str,
        data: Path,
        *,
        labels: Path | None = None,
        run_dir: Path,
        cache_dir: Path | None = None,
        device: str = "cpu",
        precision: Precision = "auto",
        seed: int = 0,
        log: Log = print,
    ) -> RunContext:
        dataset = load_valid_dataset(data, labels)  # before anything heavy is loaded
        device = check_device(device)
        seed_everything(seed)
        bundle = ModelBundle.load(store, model, device=device)
        resolved = resolve_precision(precision, device)
        # Features are stored in float32 / float16 whatever the precision they were computed in,
        # but a bf16 tower gives other numbers: the precision is part of the cache key.
        cache = FeatureCache.for_version(cache_dir or default_cache_dir(), bundle.manifest, resolved)
        run_dir.mkdir(parents=True, exist_ok=True)
        log(f"{bundle.ref}: {len(dataset.items)} records ({dataset.counts()}), device {device}, {resolved}")
        images = Images(bundle.image_size, bundle.preprocess_config)
        features = ImageFeatures(bundle, cache, images, device, resolved, log)
        return cls(store, bundle, dataset, features, run_dir, device, resolved, seed, log)

    def checkpoint(self, name: str) -> Path:
        return self.run_dir / f"{name}.checkpoint.pt"

    def checkpoints(self, name: str, every: int, stop_after: int | None) -> Checkpoints:
        """The run's checkpoints of method ``name`` (in the run directory)."""
        return Checkpoints(self.checkpoint(name), every=every, stop_after=stop_after)

    def runtime(self) -> Runtime:
        """Seed, device, autocast at the run's precision and log, as a method's loop takes them."""
        return Runtime(self.seed, self.device, lambda: autocast(self.device, self.precision), self.log)


def items_of(dataset: Dataset, kind: str, split: str | None = "train") -> list[Item]:
    """Items of one kind, from one split (``None``: all of them)."""
    items = dataset.of_kind(kind)
    if split is None:
        return items
    chosen = {id(i) for i in dataset.split(split)}  # type: ignore[arg-type]
    return [i for i in items if id(i) in chosen]


def captioned_images(dataset: Dataset, split: str | None = "train") -> tuple[list[ImageRef], list[str]]:
    """(image, caption) of a split, what every method that reads captions trains on: ``caption``
    and ``negatives`` records' captions as written, then labelled images as "a photo of a {label}."."""
    refs, texts, _ = labelled_captioned_images(dataset, split)
    return refs, texts


def labelled_captioned_images(
    dataset: Dataset, split: str | None = "train"
) -> tuple[list[ImageRef], list[str], list[str | None]]:
    """``captioned_images`` with each image's label (``None`` for a caption record's image)."""
    refs: list[ImageRef] = []
    texts: list[str] = []
    labels: list[str | None] = []
    for item in items_of(dataset, "caption", split) + items_of(dataset, "negatives", split):
        assert isinstance(item.record, CaptionRecord | NegativesRecord)
        refs.append(item.images[0])
        texts.append(item.record.caption)
        labels.append(None)
    for item in items_of(dataset, "label", split):
        assert isinstance(item.record, LabelRecord)
        refs.append(item.images[0])
        texts.append(f"a photo of {article(item.record.label)} {item.record.label}.")
        labels.append(item.record.label)
    return refs, texts, labels


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
