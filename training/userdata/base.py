"""A CLIP trained from scratch on a user's captioned images, at its config's own image size.

Captions are the user's ``caption`` and ``negatives`` records as written and "a photo of a
{label}" for labelled images (training split only); with ``attribute_captions``, labelled images
are also described by their label's attributes without its name
(``training.userdata.base_captions``). Images are decoded and resized once into a uint8 memory
map in the run directory (``pixels-<size>.npy``), so an epoch reads no JPEG. The recipe and its
loop are the shapes world's (``training.methods.base``: AdamW with warm-up and cosine, the text
tower frozen at its random initialisation for the first steps, an optional FILIP term from the
end of the freeze on for usable dense features, bf16 autocast), with checkpoints every
``checkpoint_every`` steps.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clipcore.models.clip_model import build_model
from clipcore.models.preprocess import PreprocessConfig
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import Manifest, ModelStore
from training.datasets.dataset import Dataset
from training.datasets.source import ImageRef
from training.encode import Tokenize
from training.from_scratch import image_size
from training.methods import base
from training.methods.checkpoint import Checkpoints, Runtime
from training.progress import StepProgress, loss_with_chance
from training.userdata.base_captions import BaseCaptions
from training.userdata.context import labelled_captioned_images
from training.userdata.device import autocast, seed_everything
from training.userdata.features import Images
from training.userdata.publishing import data_summary, run_settings
from training.userdata.settings import BaseRun

Log = Callable[[str], None]
DEFAULT_RUNTIME = Runtime()  # seed 0, CPU, printed log


def captioned(dataset: Dataset, cfg: BaseRun) -> tuple[list[ImageRef], BaseCaptions]:
    refs, texts, labels = labelled_captioned_images(dataset)
    if len(refs) < 2:
        raise ValueError("base training needs at least two captioned or labelled images (docs/data.md)")
    captions = BaseCaptions(texts, labels, dataset.labels, cfg.attribute_captions, cfg.text_freeze_steps)
    return refs, captions


def pixel_map(images: Images, digests: list[str], run_dir: Path, log: Log) -> np.ndarray:
    """The images as one (N, S, S, 3) uint8 memory map, rebuilt only when the image list changed."""
    path = run_dir / f"pixels-{images.size}.npy"
    stamp = run_dir / f"pixels-{images.size}.json"
    key = hashlib.sha256("\n".join(digests).encode()).hexdigest()
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        return np.load(path, mmap_mode="r")
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(len(digests), images.size, images.size, 3))
    with StepProgress("decode images", total=len(digests)) as bar:
        bar.info = f"{images.size} px"
        for i in range(0, len(digests), 256):
            out[i : i + 256] = images.pixels(digests[i : i + 256])
            bar.update(len(digests[i : i + 256]))
    out.flush()
    stamp.write_text(json.dumps({"key": key, "images": len(digests)}))
    log(f"base: {len(digests)} images decoded to {path}")
    return np.load(path, mmap_mode="r")


def train_user_base(
    dataset: Dataset,
    model_config: dict[str, Any],
    cfg: BaseRun,
    run_dir: Path,
    *,
    runtime: Runtime = DEFAULT_RUNTIME,
    precision: str = "bf16",
    preprocess: PreprocessConfig,
) -> torch.nn.Module:
    """Train (or resume from ``run_dir/base.checkpoint.pt``) and return the model. ``preprocess``:
    what the version is published with (images are read and normalised as it will be served).
    ``runtime``: seed, device and log (the autocast is ``precision``'s)."""
    seed, device, log = runtime.seed, runtime.device, runtime.log
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    model = build_model(model_config).to(device)
    images = Images(image_size(model_config), preprocess)
    refs, captions = captioned(dataset, cfg)
    pixels = pixel_map(images, images.digests(refs), run_dir, log)
    tokenize = Tokenize(model.context_length)
    n, batch = len(refs), min(cfg.batch_size, len(refs))
    checkpoints = Checkpoints(run_dir / "base.checkpoint.pt", every=cfg.checkpoint_every, stop_after=cfg.stop_after)
    end = checkpoints.end(cfg.steps)
    t0 = time.time()

    def batches(step: int) -> base.Batch:
        rng = np.random.default_rng([seed, step, 7])  # from the step: resumable
        torch.manual_seed(int(rng.integers(2**31)))
        idx = np.sort(rng.choice(n, size=batch, replace=False))
        return base.Batch(preprocess.normalize(pixels[idx]), tokenize(captions.at(step, idx.tolist(), seed)))

    def record(
        done: int, model: torch.nn.Module, loss: float, history: list[dict[str, Any]], contrastive: float
    ) -> str:
        history.append({"step": done, "loss": loss, "seconds": time.time() - t0})
        return f"contrastive loss {loss_with_chance(contrastive, batch)}"

    runtime = Runtime(seed, device, lambda: autocast(device, precision), log)
    result = base.train(model, batches, cfg, record=record, checkpoints=checkpoints, runtime=runtime)
    start, contrastive = result.start, result.contrastive
    if start < end:
        log(f"base: image-text contrastive loss at step {end} {loss_with_chance(contrastive, batch)}")
    return model.eval()


def run_user_base(
    store: ModelStore,
    name: str,
    dataset: Dataset,
    model_config: dict[str, Any],
    cfg: BaseRun,
    run_dir: Path,
    *,
    runtime: Runtime = DEFAULT_RUNTIME,
    precision: str = "bf16",
    aliases: tuple[str, ...] = (),
    preprocess: PreprocessConfig | None = None,
) -> Manifest | None:
    """Train from scratch and publish ``name``'s new version (None when ``stop_after`` ended early),
    with ``preprocess`` in its manifest (OpenAI CLIP's values when None, as ``TrainedModel``)."""
    preprocess = preprocess or PreprocessConfig()
    model = train_user_base(dataset, model_config, cfg, run_dir, runtime=runtime, precision=precision,
                            preprocess=preprocess)  # fmt: skip
    if cfg.stop_after is not None and cfg.stop_after < cfg.steps:
        return None
    trained = TrainedModel(
        model.cpu(), model_config, preprocess=preprocess, data=data_summary(dataset, "user"),
        training={"method": "base", "seed": runtime.seed, "device": runtime.device, "precision": precision,
                  **run_settings(cfg)},  # fmt: skip
        notes="CLIP trained from scratch on user data",
    )  # fmt: skip
    return publish_bundle(store, name, trained, aliases=list(aliases))
