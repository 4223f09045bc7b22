"""SemCLIP: finetune the text tower so paraphrases stay close and negations move away.

Images of TRAIN scenes are embedded once by the frozen image tower. Each step takes a batch of
(image, original, paraphrase, negation) and minimises ``clipcore.methods.losses.semclip_loss``
in a fixed random projection subspace. Weights ``(a, b, c)`` of (clip, paraphrase, negation)
give the ablations: ``(1, 1, 0)`` is paraphrase-only, ``(1, 0, 1)`` negation-only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.losses import semclip_loss
from clipcore.methods.semclip import projection_directions
from clipcore.models.clip_model import embed_width, normalize, text_features
from clipcore.models.preprocess import PreprocessConfig
from training.distributed import sharded_features
from training.encode import Tokenize, encode_images
from training.text_finetune import finetune_text_tower
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
class SemClipConfig:
    scenes: int = 12000
    steps: int = 600
    batch_size: int = 128
    lr: float = 2e-4
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    directions: int = 2
    normalise: bool = True
    negatives_in_clip: bool = True
    seed: int = 0
    device: str = "cpu"


def triplet_dataset(cfg: SemClipConfig, model: CLIP, preprocess: PreprocessConfig) -> dict:
    triplets = triplet_set(Split.TRAIN, cfg.seed + 300, cfg.scenes)
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
    may be passed to share it between variants; ``preprocess``: the base version's."""
    if data is None:
        t0 = time.time()
        data = triplet_dataset(cfg, base.to(cfg.device), preprocess)
        log(f"semclip: {cfg.scenes} caption triplets embedded in {time.time() - t0:.1f}s")
    tokenize = Tokenize(base.context_length)
    dim = embed_width(base)
    directions = torch.from_numpy(projection_directions(dim, cfg.directions, cfg.seed)).to(cfg.device)
    scale = float(base.logit_scale.exp().clamp(max=100).item())
    rng = np.random.default_rng([cfg.seed, 31])

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        idx = rng.choice(len(data["original"]), size=cfg.batch_size, replace=False)

        def encode(texts: list[str]) -> torch.Tensor:
            return normalize(text_features(model, tokenize(texts).to(cfg.device))[0].float())

        # Under torchrun each rank encodes its slice of the batch; the loss sees all of it.
        t, tp, tn = (
            sharded_features(encode, [data[k][i] for i in idx]) for k in ("original", "paraphrase", "negation")
        )
        loss, parts = semclip_loss(
            data["images"][idx].to(cfg.device),
            t,
            tp,
            tn,
            directions,
            scale,
            cfg.weights,
            cfg.normalise,
            cfg.negatives_in_clip,
        )
        return loss, " ".join(f"{k} {v:.3f}" for k, v in parts.items())

    state, history = finetune_text_tower(
        base, step_loss, steps=cfg.steps, lr=cfg.lr, seed=cfg.seed, device=cfg.device, label="semclip"
    )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "semclip_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return state


__all__ = ["VARIANT_WEIGHTS", "SemClipConfig", "train_semclip", "triplet_dataset"]
