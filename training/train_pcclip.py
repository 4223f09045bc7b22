"""PC-CLIP on the shapes world: rendered pairs that differ in one attribute, their difference
texts and each pair's first image's caption, embedded once by the frozen image tower; the method
itself (losses and loop) is ``training.methods.pcclip``.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.preprocess import PreprocessConfig
from training.encode import Tokenize, encode_images
from training.methods import pcclip
from training.methods.checkpoint import Checkpoints, Runtime
from training.world.captions import random_caption
from training.world.differences import sample_difference_pair
from training.world.render import render_batch
from training.world.scene import Split


@dataclass
class PCClipConfig(pcclip.Hyper):
    """PC-CLIP on the shapes world: ``pcclip.Hyper`` and the pairs the world renders."""

    steps: int = 500
    lr: float = 2e-4
    pairs: int = 12000
    batch_size: int = 128
    fine_size_fraction: float = 0.5  # pairs of one size class that differ in radius
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 100


def difference_dataset(cfg: PCClipConfig, model: CLIP, preprocess: PreprocessConfig) -> dict:
    """Image embeddings of every pair (computed once) plus texts and attributes."""
    pairs = [
        sample_difference_pair(Split.TRAIN, cfg.seed, i, p_fine_size=cfg.fine_size_fraction) for i in range(cfg.pairs)
    ]
    rng = np.random.default_rng([cfg.seed, 5])
    firsts = render_batch([p.first for p in pairs], model.visual.image_size[0], seed=int(rng.integers(2**31)))
    seconds = render_batch([p.second for p in pairs], model.visual.image_size[0], seed=int(rng.integers(2**31)))
    g1 = encode_images(model, preprocess, firsts, device=cfg.device)
    g2 = encode_images(model, preprocess, seconds, device=cfg.device)
    captions = [random_caption(p.first, rng) for p in pairs]
    attrs = [p.attribute for p in pairs]
    return {"g1": g1, "g2": g2, "texts": [p.text for p in pairs], "captions": captions, "attributes": attrs}


def train_pcclip(
    base: CLIP,
    cfg: PCClipConfig,
    out_dir: Path | None = None,
    log=print,
    *,
    preprocess: PreprocessConfig,  # noqa: ANN001
) -> dict[str, torch.Tensor]:
    """Returns the finetuned model's state dict (text tower changed, image tower untouched).
    ``preprocess``: the base version's (its manifest's, or what a new base is published with).
    With ``out_dir`` the run checkpoints there and resumes from it."""
    t0 = time.time()
    data = difference_dataset(cfg, base.to(cfg.device), preprocess)
    log(f"pcclip: {cfg.pairs} pairs embedded in {time.time() - t0:.1f}s")

    def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([cfg.seed, step, 9])  # from the step: a resumed run sees the same batches
        idx = rng.choice(cfg.pairs, size=cfg.batch_size, replace=False)
        return idx, idx  # the caption term reads each pair's first image and its caption

    features = pcclip.DifferenceData(data["g1"], data["g2"], data["texts"], data["g1"], data["captions"])
    scale = float(base.logit_scale.exp().clamp(max=100).item())
    path = None if out_dir is None else out_dir / "pcclip.checkpoint.pt"
    checkpoints = Checkpoints(path, every=cfg.checkpoint_every, settings=asdict(cfg))
    state, history = pcclip.train(base, features, batches, cfg, tokenize=Tokenize(base.context_length), scale=scale,
                                  runtime=Runtime(cfg.seed, cfg.device, log=log), checkpoints=checkpoints)  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "pcclip_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}, indent=2))
    return state


def with_state(base: CLIP, state: dict[str, torch.Tensor]) -> CLIP:
    model = copy.deepcopy(base)
    model.load_state_dict(state)
    return model.eval()


__all__ = ["PCClipConfig", "train_pcclip", "with_state"]
