"""What every training run on a user's data shares: the validated dataset, the base version, the
device and precision, the seed, and the frozen image features (``training.feature_cache``).

``RunContext.open`` validates the data first (every problem with its file and line, and no
training when there is one), then loads the base version from the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from clipcore.models.bundle import ModelBundle
from clipcore.models.encoding import encode_pixels
from clipcore.models.preprocess import PreprocessConfig, upright
from model_store import ModelStore
from training import distributed
from training.datasets.dataset import Dataset, load_dataset, require_valid
from training.datasets.records import CaptionRecord, LabelRecord, NegativesRecord
from training.datasets.source import ImageRef, Item
from training.feature_cache import DTYPES, FeatureCache, Kind, default_cache_dir
from training.generate.differences import article
from training.progress import StepProgress

Log = Callable[[str], None]
Precision = Literal["auto", "fp32", "bf16", "fp16"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, and only when that device exists."""
    if device == "cpu":
        return device
    if not device.startswith("cuda") or (device != "cuda" and not device[5:].lstrip(":").isdigit()):
        raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    return device


def resolve_precision(precision: Precision, device: str) -> str:
    """``auto``: bf16 on a CUDA device that has it, else fp16 there; fp32 on CPU (text finetunes
    move by small steps that bf16's 8-bit mantissa loses)."""
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.split(":")[0], dtype=dtype)


def load_valid_dataset(data: Path, labels: Path | None = None) -> Dataset:
    """The dataset, or ``InvalidDataset`` listing every problem (file and line): nothing trains on bad data."""
    return require_valid(load_dataset(data, labels))


@dataclass
class Images:
    """The distinct images of a dataset by content digest, decoded and resized on demand."""

    size: int
    preprocess: PreprocessConfig  # the version's (its manifest's): resize, crop, interpolation
    refs: dict[str, ImageRef] = field(default_factory=dict)
    _digest_of: dict[int, str] = field(default_factory=dict, repr=False)

    def digest(self, ref: ImageRef) -> str:
        key = id(ref)
        if key not in self._digest_of:
            digest = hashlib.sha256(ref.read()).hexdigest()
            self._digest_of[key] = digest
            self.refs.setdefault(digest, ref)
        return self._digest_of[key]

    def digests(self, refs: Sequence[ImageRef]) -> list[str]:
        return [self.digest(r) for r in refs]

    def pixels(self, digests: Sequence[str]) -> np.ndarray:
        """(N, S, S, 3) uint8, preprocessed as the service does (``PreprocessConfig.fit``)."""
        out = np.zeros((len(digests), self.size, self.size, 3), dtype=np.uint8)
        for i, digest in enumerate(digests):
            with Image.open(io.BytesIO(self.refs[digest].read())) as img:
                out[i] = self.preprocess.fit(upright(img), self.size)
        return out


@dataclass
class RunContext:
    """A base version, a validated dataset and where features and checkpoints go."""

    store: ModelStore
    bundle: ModelBundle
    dataset: Dataset
    cache: FeatureCache
    images: Images
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
        return cls(store, bundle, dataset, cache, images, run_dir, device, resolved, seed, log)

    # ------------------------------------------------------------------ frozen image features
    def _encode(self, kind: Kind, pixels: np.ndarray) -> np.ndarray:
        pooled, tokens = encode_pixels(self.bundle.model, self.bundle.preprocess_config, pixels, device=self.device,
                                       dense=kind == "dense", amp=autocast(self.device, self.precision))  # fmt: skip
        if kind == "dense":
            if tokens is None:
                raise ValueError(f"{self.bundle.ref}'s image tower gives no patch tokens (DCSM needs a ViT)")
            return tokens.cpu().numpy()
        return pooled.cpu().numpy()

    def features(self, kind: Kind, refs: Sequence[ImageRef], batch_size: int = 64) -> np.ndarray:
        """Features of ``refs`` (in order), computing only those not in the cache."""
        digests = self.images.digests(refs)
        store = self.cache.store(kind)
        todo = store.missing(digests)
        if todo and distributed.world().size > 1:
            return self._features_across_ranks(kind, digests, todo, batch_size)
        if todo:
            with StepProgress(f"{kind} image features", total=len(todo)) as bar:
                bar.info = f"{len(digests) - len(todo)} cached"
                self.cache.ensure(
                    kind,
                    todo,
                    self.images.pixels,
                    lambda px: self._encode(kind, px),
                    batch_size,
                    progress=lambda n: bar.update(n),
                )
        self.log(f"{kind} features: {len(set(digests))} images, {len(todo)} computed, the rest from {store.directory}")
        return store.get(digests)

    def _features_across_ranks(self, kind: Kind, digests: list[str], todo: list[str], batch_size: int) -> np.ndarray:
        """Under torchrun: each rank encodes its shard of the missing images, every rank gets all
        of them, rank 0 adds them to the cache (the others wait for it before reading)."""
        store = self.cache.store(kind)

        def encode(part: list[str]) -> torch.Tensor:
            rows = [self._encode(kind, self.images.pixels(part[i : i + batch_size]))
                    for i in range(0, len(part), batch_size)]  # fmt: skip
            return torch.from_numpy(np.concatenate(rows))

        if len(todo) < distributed.world().size:  # too few to share: every rank encodes them all
            computed = encode(todo).numpy()
        else:
            computed = distributed.map_sharded(encode, todo).numpy()
        computed = computed.astype(DTYPES[kind])
        if distributed.is_main():
            store.add(todo, computed)
        torch.distributed.barrier()
        store.refresh()  # every rank now sees what rank 0 added, so later calls agree on what is missing
        row = {d: i for i, d in enumerate(todo)}
        cached = [d for d in dict.fromkeys(digests) if d not in row]
        known = dict(zip(cached, store.get(cached), strict=True)) if cached else {}
        self.log(f"{kind} features: {len(set(digests))} images, {len(todo)} computed across ranks")
        return np.stack([computed[row[d]] if d in row else known[d] for d in digests])

    def checkpoint(self, name: str) -> Path:
        return self.run_dir / f"{name}.checkpoint.pt"


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
    refs, texts = [], []
    for item in items_of(dataset, "caption", split) + items_of(dataset, "negatives", split):
        assert isinstance(item.record, CaptionRecord | NegativesRecord)
        refs.append(item.images[0])
        texts.append(item.record.caption)
    for item in items_of(dataset, "label", split):
        assert isinstance(item.record, LabelRecord)
        refs.append(item.images[0])
        texts.append(f"a photo of {article(item.record.label)} {item.record.label}.")
    return refs, texts


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
