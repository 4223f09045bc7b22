"""The frozen image features a training run on a user's data reads: each distinct image of the
dataset encoded once by the base version's image tower, through the path serving uses
(``clipcore.models.encoding.encode_pixels`` with the manifest's preprocessing), and kept in the
feature cache (``training.feature_cache``) for later runs on the same version; under torchrun the
ranks share the encoding."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from clipcore.models.bundle import ModelBundle
from clipcore.models.encoding import encode_pixels
from clipcore.models.preprocess import PreprocessConfig, upright
from training import distributed
from training.datasets.source import ImageRef
from training.feature_cache import DTYPES, FeatureCache, Kind
from training.progress import StepProgress
from training.userdata.device import autocast

Log = Callable[[str], None]


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
class ImageFeatures:
    """Pooled or dense image features of a base version, computed once per image (``of``)."""

    bundle: ModelBundle
    cache: FeatureCache
    images: Images
    device: str = "cpu"
    precision: str = "fp32"
    log: Log = print

    def _encode(self, kind: Kind, pixels: np.ndarray) -> np.ndarray:
        pooled, tokens = encode_pixels(self.bundle.model, self.bundle.preprocess_config, pixels, device=self.device,
                                       dense=kind == "dense", amp=autocast(self.device, self.precision))  # fmt: skip
        if kind == "dense":
            if tokens is None:
                raise ValueError(f"{self.bundle.ref}'s image tower gives no patch tokens (DCSM needs a ViT)")
            return tokens.cpu().numpy()
        return pooled.cpu().numpy()

    def of(self, kind: Kind, refs: Sequence[ImageRef], batch_size: int = 64) -> np.ndarray:
        """Features of ``refs`` (in order), computing only those not in the cache."""
        digests = self.images.digests(refs)
        store = self.cache.store(kind)
        todo = store.missing(digests)
        if todo and distributed.world().size > 1:
            return self._across_ranks(kind, digests, todo, batch_size)
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

    def _across_ranks(self, kind: Kind, digests: list[str], todo: list[str], batch_size: int) -> np.ndarray:
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
