"""Real embeddings for the collections benchmark: Fashion-MNIST photos and shapes-world scenes
through a served model's towers, cached in one ``.npz`` file.

Random unit vectors are the worst case of any graph or cluster index (no structure to use);
what a collection holds are a model's embeddings of real images, which cluster. This embeds:

- the gallery: Fashion-MNIST's 60,000 training photos and its test photos after the first
  ``held_out``, and ``shapes`` scenes of the shapes world's training stream (rendered as the
  world's evaluation renders them, 64 px, clean);
- image queries, never in the gallery: the first ``held_out`` Fashion-MNIST test photos and
  ``held_out`` scenes of the world's test stream;
- text queries (the text tower): the held-out scenes' full captions and, for the photos, a
  caption of each label from a few templates.

The file's arrays: ``gallery`` (N, D) float32, ``gallery_source`` (N,) 0 photo / 1 scene,
``image_queries``, ``text_queries`` (float32) and ``texts`` (the text queries' captions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FASHION_TEMPLATES = ("a photo of a {}.", "a {}.", "a grey photo of a {}.", "a product photo of the {}.")


@dataclass(frozen=True)
class RealVectors:
    gallery: np.ndarray
    gallery_source: np.ndarray
    image_queries: np.ndarray
    text_queries: np.ndarray
    texts: np.ndarray

    @classmethod
    def load(cls, path: Path) -> RealVectors:
        with np.load(path) as f:
            return cls(*(f[name] for name in cls.__dataclass_fields__))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:  # np.savez would add ".npz" to a name without it
            np.savez(fh, **{name: getattr(self, name) for name in self.__dataclass_fields__})


def embed(
    store: Path, ref: str, fashion: int | None, shapes: int, held_out: int, threads: int, batch: int = 256
) -> RealVectors:
    """Embed the gallery and the queries with ``ref``'s image and text towers (``threads`` torch
    threads); ``fashion`` caps the Fashion-MNIST gallery photos (None: all 69,000 - ``held_out``)."""
    import torch
    from PIL import Image

    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore
    from training.datasets.fashion_mnist import DEFAULT_SOURCE, LABELS, read_idx
    from training.world.captions import full_caption
    from training.world.render import render_batch
    from training.world.scene import Split, sample_scene

    torch.set_num_threads(threads)
    bundle = ModelBundle.load(ModelStore(store), ref)

    def photos(raw: np.ndarray) -> np.ndarray:
        # The serving path's fit (grey to RGB, resized to the tower's side), in batches so the
        # (N, 64, 64, 3) pixels of 70,000 photos are never all held at once.
        out = [np.zeros((0, bundle.embed_dim), np.float32)]
        for i in range(0, len(raw), batch):
            pixels = np.stack([bundle.preprocess(Image.fromarray(p).convert("RGB")) for p in raw[i : i + batch]])
            out.append(bundle.encode_images(pixels))
        return np.concatenate(out)

    def scenes(split: Split, n: int) -> tuple[np.ndarray, list[str]]:
        out, captions = [np.zeros((0, bundle.embed_dim), np.float32)], []
        for i in range(0, n, batch):
            drawn = [sample_scene(split, 0, j) for j in range(i, min(i + batch, n))]
            out.append(bundle.encode_images(render_batch(drawn, bundle.image_size, seed=None)))
            captions += [full_caption(s) for s in drawn]
        return np.concatenate(out), captions

    started = time.process_time()
    train = read_idx(DEFAULT_SOURCE / "train-images-idx3-ubyte.gz")
    test = read_idx(DEFAULT_SOURCE / "t10k-images-idx3-ubyte.gz")
    pool = np.concatenate([train, test[held_out:]])
    photo_gallery = photos(pool if fashion is None else pool[:fashion])
    scene_gallery, _ = scenes(Split.TRAIN, shapes)
    photo_queries = photos(test[:held_out])
    scene_queries, captions = scenes(Split.TEST, held_out)
    texts = captions + [t.format(label) for label in LABELS for t in FASHION_TEMPLATES]
    text_queries = np.concatenate([bundle.encode_texts(texts[i : i + batch]) for i in range(0, len(texts), batch)])
    print(f"embedded with {ref} in {time.process_time() - started:.0f} CPU s ({threads} threads)", flush=True)
    return RealVectors(
        gallery=np.concatenate([photo_gallery, scene_gallery]).astype(np.float32),
        gallery_source=np.repeat([0, 1], [len(photo_gallery), len(scene_gallery)]).astype(np.int8),
        image_queries=np.concatenate([photo_queries, scene_queries]).astype(np.float32),
        text_queries=text_queries.astype(np.float32),
        texts=np.array(texts),
    )


def grown(gallery: np.ndarray, n: int, noise: float, seed: int) -> np.ndarray:
    """``gallery`` followed by noisy copies of its rows up to ``n`` rows: copy ``i`` is row
    ``i % len(gallery)`` plus Gaussian noise of norm about ``noise``, renormalised (synthetic:
    each real vector gets a tight cloud of near-duplicates; documented as such wherever used)."""
    if n <= len(gallery):
        return gallery[:n]
    rng = np.random.default_rng(seed)
    out = np.empty((n, gallery.shape[1]), np.float32)
    out[: len(gallery)] = gallery
    for start in range(len(gallery), n, 100_000):
        stop = min(start + 100_000, n)
        rows = gallery[np.arange(start, stop) % len(gallery)]
        rows = rows + rng.standard_normal(rows.shape).astype(np.float32) * (noise / np.sqrt(gallery.shape[1]))
        out[start:stop] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out
