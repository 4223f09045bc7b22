"""PC-CLIP: finetune the text tower so f(T12) aligns with g(I1) - g(I2).

The image tower is frozen, so every image embedding is computed once up front. Besides the
difference loss, the ordinary image-caption loss is kept (image side frozen) so zero-shot
accuracy does not drift. The loop itself is ``training.text_finetune``.
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

from clipcore.methods.losses import clip_contrastive_loss, pcclip_difference_loss, weight_ensemble
from clipcore.models.clip_model import normalize, text_features
from clipcore.models.preprocess import PreprocessConfig
from training.distributed import sharded_features
from training.encode import Tokenize, encode_images
from training.text_finetune import finetune_text_tower
from training.world.captions import random_caption
from training.world.differences import sample_difference_pair
from training.world.render import render_batch
from training.world.scene import Split


@dataclass
class PCClipConfig:
    pairs: int = 12000
    steps: int = 500
    batch_size: int = 128
    lr: float = 2e-4
    temperature: float = 0.1
    loss: str = "contrastive"  # or "mse"
    caption_weight: float = 0.3
    fine_size_fraction: float = 0.5  # pairs of one size class that differ in radius
    ensemble_weight: float = 1.0  # w * finetuned + (1 - w) * base
    seed: int = 0
    device: str = "cpu"


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
    ``preprocess``: the base version's (its manifest's, or what a new base is published with)."""
    tokenize = Tokenize(base.context_length)
    t0 = time.time()
    data = difference_dataset(cfg, base.to(cfg.device), preprocess)
    log(f"pcclip: {cfg.pairs} pairs embedded in {time.time() - t0:.1f}s")
    scale = float(base.logit_scale.exp().clamp(max=100).item())
    rng = np.random.default_rng([cfg.seed, 9])

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        idx = rng.choice(cfg.pairs, size=cfg.batch_size, replace=False)

        def encode(texts: list[str]) -> torch.Tensor:
            return normalize(text_features(model, tokenize(texts).to(cfg.device))[0].float())

        # Under torchrun each rank encodes its slice of the batch; the loss sees all of it.
        f_t = sharded_features(encode, [data["texts"][i] for i in idx])
        g1, g2 = data["g1"][idx].to(cfg.device), data["g2"][idx].to(cfg.device)
        loss = pcclip_difference_loss(g1, g2, f_t, temperature=cfg.temperature, kind=cfg.loss)  # type: ignore[arg-type]
        if cfg.caption_weight > 0:
            f_c = sharded_features(encode, [data["captions"][i] for i in idx])
            loss = loss + cfg.caption_weight * clip_contrastive_loss(g1, f_c, scale)
        return loss, f"loss {loss.item():.3f}"

    state, history = finetune_text_tower(
        base, step_loss, steps=cfg.steps, lr=cfg.lr, seed=cfg.seed, device=cfg.device, label="pcclip"
    )
    if cfg.ensemble_weight < 1.0:
        state = weight_ensemble(base.state_dict(), state, cfg.ensemble_weight)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "pcclip_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}, indent=2))
    return state


def with_state(base: CLIP, state: dict[str, torch.Tensor]) -> CLIP:
    model = copy.deepcopy(base)
    model.load_state_dict(state)
    return model.eval()


__all__ = ["PCClipConfig", "train_pcclip", "with_state"]
