"""SemCLIP on the shapes world: TRAIN scenes with a caption, its paraphrase and its negation (in the
negation grammar's training forms where it has them: ``training.world.semantic``, ``grammar``),
embedded once by the frozen image tower, and the ablation variants' loss weights; the method itself
(loss and loop) is ``training.methods.semclip``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.preprocess import PreprocessConfig
from training.encode import Tokenize, encode_images
from training.methods import semclip
from training.methods.checkpoint import Checkpoints, Runtime
from training.world.render import render_batch
from training.world.scene import Split
from training.world.semantic import triplet_set

# Loss weights (clip, paraphrase, negation) of SemCLIP and its two ablations.
VARIANT_WEIGHTS: dict[str, tuple[float, float, float]] = {
    "semclip": (1.0, 1.0, 1.0),
    "semclip_para": (1.0, 1.0, 0.0),
    "semclip_neg": (1.0, 0.0, 1.0),
}


@dataclass
class SemClipConfig(semclip.Hyper):
    """SemCLIP on the shapes world: ``semclip.Hyper`` and the scenes the world renders."""

    steps: int = 600
    lr: float = 2e-4
    scenes: int = 12000
    batch_size: int = 128
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 100
    grammar: bool = True  # False: the fixed templates SemCLIP trained on before the grammar


def triplet_dataset(cfg: SemClipConfig, model: CLIP, preprocess: PreprocessConfig) -> dict:
    triplets = triplet_set(Split.TRAIN, cfg.seed + 300, cfg.scenes, grammar=cfg.grammar)
    images = render_batch([t.scene for t in triplets], model.visual.image_size[0], seed=cfg.seed + 17)
    return {
        "images": encode_images(model, preprocess, images, device=cfg.device),
        "original": [t.original for t in triplets],
        "paraphrase": [t.paraphrase for t in triplets],
        "negation": [t.negation for t in triplets],
    }


def train_semclip(
    base: CLIP,
    cfg: SemClipConfig,
    data: dict | None = None,
    out_dir: Path | None = None,
    log=print,  # noqa: ANN001
    *,
    preprocess: PreprocessConfig,
) -> dict[str, torch.Tensor]:
    """Returns the finetuned state dict (text tower changed). ``data`` from ``triplet_dataset``
    may be passed to share it between variants; ``preprocess``: the base version's. With ``out_dir``
    the run checkpoints there and resumes from it."""
    if data is None:
        t0 = time.time()
        data = triplet_dataset(cfg, base.to(cfg.device), preprocess)
        log(f"semclip: {cfg.scenes} caption triplets embedded in {time.time() - t0:.1f}s")

    def rows(step: int) -> np.ndarray:  # from the step: a resumed run sees the same batches
        return np.random.default_rng([cfg.seed, step, 31]).choice(len(data["original"]), size=cfg.batch_size,
                                                                  replace=False)  # fmt: skip

    triplets = semclip.TripletData(data["images"], data["original"], data["paraphrase"], data["negation"])
    scale = float(base.logit_scale.exp().clamp(max=100).item())
    path = None if out_dir is None else out_dir / "semclip.checkpoint.pt"
    checkpoints = Checkpoints(path, every=cfg.checkpoint_every, settings=asdict(cfg))
    state, history = semclip.train(base, triplets, rows, cfg, tokenize=Tokenize(base.context_length), scale=scale,
                                   runtime=Runtime(cfg.seed, cfg.device, log=log), checkpoints=checkpoints)  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "semclip_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return state


__all__ = ["VARIANT_WEIGHTS", "SemClipConfig", "train_semclip", "triplet_dataset"]
