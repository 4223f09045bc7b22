"""Frozen image features on disk, computed once per image tower and image, memory-mapped.

Every method trained on a user's data keeps the image tower frozen, so the features of an image
never change for a given tower: they are computed once and reused by every later run and
subcommand (``pcclip``, ``dcsm``, ``semclip``, ``yukino``, ``comparatives``, evaluations).

Layout under the cache root::

    <root>/<tower key>/meta.json            which versions use it, feature shapes
    <root>/<tower key>/<kind>/index.json    image sha256 -> [chunk, row]
    <root>/<tower key>/<kind>/chunk-00000.npy, ...

``kind`` is ``pooled`` (``(D,)`` float32, what ``/embed`` returns) or ``dense`` (``(1+P, D)``
float16 class + patch tokens, DCSM's and YUKINO's input). The tower key is a digest of what
decides an image feature: the architecture, the preprocessing, the image size, the sha256 of the
weights file and the precision. A version derived from another (PC-CLIP, DCSM, comparatives) keeps
its base's weights file, so it shares its base's cache. New features are appended as a new chunk
file (written whole, then renamed) and the index is replaced atomically after it, under a lock,
so an interrupted run leaves no half-written entry and two runs do not overwrite each other.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from clipcore.models.components import Components
from model_store import Manifest

Kind = Literal["pooled", "dense"]
KINDS: tuple[Kind, ...] = ("pooled", "dense")
DTYPES: dict[Kind, Any] = {"pooled": np.float32, "dense": np.float16}
# Features are computed and appended in chunks of this many images (one file each).
CHUNK_IMAGES = 1024


def tower_key(manifest: Manifest, precision: str = "fp32") -> str:
    """The digest that names an image tower's cache (see the module docstring)."""
    weights = Components.from_manifest(manifest.components).weights
    digest = manifest.files[weights].sha256 if weights is not None and weights in manifest.files else "random-init"
    identity = {
        "architecture": manifest.architecture,
        "hooks": manifest.hooks,
        "image_size": manifest.image_size,
        "preprocess": manifest.preprocess,
        "weights": digest,
        "precision": precision,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def default_cache_dir() -> Path:
    """``$CLIP_FEATURE_CACHE`` or ``~/.cache/clip-train/features``."""
    env = os.environ.get("CLIP_FEATURE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "clip-train" / "features"


@dataclass
class FeatureStore:
    """One kind of feature of one image tower: a digest index over memory-mapped chunk files."""

    directory: Path
    kind: Kind
    index: dict[str, tuple[int, int]] = field(default_factory=dict)
    computed: int = 0  # features computed (not found) by this process
    _chunks: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, directory: Path, kind: Kind) -> FeatureStore:
        store = cls(directory / kind, kind)
        store.directory.mkdir(parents=True, exist_ok=True)
        store._reload()
        return store

    def refresh(self) -> None:
        """Read the index again (another process, e.g. torchrun's rank 0, may have added features)."""
        self._reload()

    def _reload(self) -> None:
        path = self.directory / "index.json"
        if path.exists():
            self.index = {k: (int(v[0]), int(v[1])) for k, v in json.loads(path.read_text()).items()}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def missing(self, digests: Sequence[str]) -> list[str]:
        return [d for d in dict.fromkeys(digests) if d not in self.index]

    def add(self, digests: Sequence[str], features: np.ndarray) -> None:
        """Append ``features`` (one row per digest) as a new chunk, then publish the index."""
        if len(digests) != len(features):
            raise ValueError("one feature row per digest")
        with self._locked():
            self._reload()  # another run may have added chunks since
            # Past every chunk on disk, indexed or not (a run stopped between the two writes).
            chunk = 1 + max((int(p.stem.split("-")[1]) for p in self.directory.glob("chunk-*.npy")), default=-1)
            target = self.directory / f"chunk-{chunk:05d}.npy"
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(features, dtype=DTYPES[self.kind]))
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, target)
            for row, digest in enumerate(digests):
                self.index[digest] = (chunk, row)
            index_tmp = self.directory / "index.json.tmp"
            index_tmp.write_text(json.dumps({k: list(v) for k, v in self.index.items()}))
            os.replace(index_tmp, self.directory / "index.json")
        self.computed += len(digests)

    def _chunk(self, chunk: int) -> np.ndarray:
        if chunk not in self._chunks:
            self._chunks[chunk] = np.load(self.directory / f"chunk-{chunk:05d}.npy", mmap_mode="r")
        return self._chunks[chunk]

    def get(self, digests: Sequence[str]) -> np.ndarray:
        """The rows of ``digests`` (gathered from the memory maps into one array)."""
        rows = [self._chunk(c)[r] for c, r in (self.index[d] for d in digests)]
        return np.stack(rows) if rows else np.zeros((0,), dtype=DTYPES[self.kind])


# (N, S, S, 3) uint8 preprocessed images -> (N, ...) features of one kind.
Encode = Callable[[np.ndarray], np.ndarray]
# digests -> preprocessed pixels of those images.
Pixels = Callable[[Sequence[str]], np.ndarray]


@dataclass
class FeatureCache:
    """Both kinds of features of one image tower, under ``root/<tower key>``."""

    root: Path
    key: str
    stores: dict[Kind, FeatureStore] = field(default_factory=dict)

    @classmethod
    def for_version(cls, root: Path, manifest: Manifest, precision: str = "fp32") -> FeatureCache:
        key = tower_key(manifest, precision)
        directory = root / key
        directory.mkdir(parents=True, exist_ok=True)
        meta_path = directory / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"versions": []}
        if manifest.ref not in meta["versions"]:
            meta["versions"].append(manifest.ref)
            meta_path.write_text(json.dumps(meta, indent=2))
        return cls(root, key)

    @property
    def directory(self) -> Path:
        return self.root / self.key

    def store(self, kind: Kind) -> FeatureStore:
        if kind not in self.stores:
            self.stores[kind] = FeatureStore.open(self.directory, kind)
        return self.stores[kind]

    @property
    def computed(self) -> dict[str, int]:
        return {kind: s.computed for kind, s in self.stores.items()}

    def ensure(
        self,
        kind: Kind,
        digests: Sequence[str],
        pixels: Pixels,
        encode: Encode,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
    ) -> FeatureStore:
        """Compute the features of the images not cached yet (in chunks of ``CHUNK_IMAGES``)."""
        store = self.store(kind)
        todo = store.missing(digests)
        for start in range(0, len(todo), CHUNK_IMAGES):
            chunk = todo[start : start + CHUNK_IMAGES]
            parts = []
            for i in range(0, len(chunk), batch_size):
                parts.append(encode(pixels(chunk[i : i + batch_size])))
                if progress is not None:
                    progress(len(parts[-1]))
            store.add(chunk, np.concatenate(parts))
        return store
