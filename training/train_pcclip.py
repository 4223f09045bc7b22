"""PC-CLIP: finetune the text tower so f(T12) aligns with g(I1) - g(I2).

The image tower is frozen, so every image embedding is computed once up front. Besides the
difference loss, the ordinary image-caption loss is kept (image side frozen) so zero-shot
accuracy does not drift. Only the text transformer, final norm and projection train: the
token-embedding table stays shared with the base, which keeps the variant file small.
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
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from service.encoders.clip_model import normalize, text_features
from service.methods.losses import clip_contrastive_loss, pcclip_difference_loss, weight_ensemble
from training.encode import Tokenize, encode_images
from training.world.captions import random_caption
from training.world.differences import sample_difference_pair
from training.world.render import render_batch
from training.world.scene import Split

TRAINABLE_PREFIXES = ("transformer.", "ln_final", "text_projection", "positional_embedding")


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


def difference_dataset(cfg: PCClipConfig, model: CLIP) -> dict:
    """Image embeddings of every pair (computed once) plus texts and attributes."""
    pairs = [
        sample_difference_pair(Split.TRAIN, cfg.seed, i, p_fine_size=cfg.fine_size_fraction) for i in range(cfg.pairs)
    ]
    rng = np.random.default_rng([cfg.seed, 5])
    firsts = render_batch([p.first for p in pairs], 64, seed=int(rng.integers(2**31)))
    seconds = render_batch([p.second for p in pairs], 64, seed=int(rng.integers(2**31)))
    g1 = encode_images(model, firsts, device=cfg.device)
    g2 = encode_images(model, seconds, device=cfg.device)
    captions = [random_caption(p.first, rng) for p in pairs]
    attrs = [p.attribute for p in pairs]
    return {"g1": g1, "g2": g2, "texts": [p.text for p in pairs], "captions": captions, "attributes": attrs}


def train_pcclip(base: CLIP, cfg: PCClipConfig, out_dir: Path | None = None, log=print) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Returns the finetuned model's state dict (text tower changed, image tower untouched)."""
    torch.manual_seed(cfg.seed)
    model = copy.deepcopy(base).to(cfg.device)
    model.eval()  # no dropout / BN updates anywhere; gradients still flow
    tokenize = Tokenize(model.context_length)
    t0 = time.time()
    data = difference_dataset(cfg, model)
    log(f"pcclip: {cfg.pairs} pairs embedded in {time.time() - t0:.1f}s")
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(TRAINABLE_PREFIXES))
        if p.requires_grad:
            params.append(p)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)
    scale = float(model.logit_scale.exp().clamp(max=100).item())
    rng = np.random.default_rng([cfg.seed, 9])
    history = []
    columns = [
        TextColumn("[bold]pcclip"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns) as bar:
        task = bar.add_task("pcclip", total=cfg.steps, info="")
        for step in range(cfg.steps):
            lr = cfg.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + np.cos(np.pi * step / cfg.steps))
            for g in opt.param_groups:
                g["lr"] = lr
            idx = rng.choice(cfg.pairs, size=cfg.batch_size, replace=False)
            texts = [data["texts"][i] for i in idx]
            f_t = normalize(text_features(model, tokenize(texts).to(cfg.device))[0].float())
            g1, g2 = data["g1"][idx].to(cfg.device), data["g2"][idx].to(cfg.device)
            loss = pcclip_difference_loss(g1, g2, f_t, temperature=cfg.temperature, kind=cfg.loss)  # type: ignore[arg-type]
            if cfg.caption_weight > 0:
                caps = [data["captions"][i] for i in idx]
                f_c = normalize(text_features(model, tokenize(caps).to(cfg.device))[0].float())
                loss = loss + cfg.caption_weight * clip_contrastive_loss(g1, f_c, scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            bar.update(task, advance=1, info=f"loss {loss.item():.3f}")
            if (step + 1) % 100 == 0:
                history.append({"step": step + 1, "loss": loss.item()})
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
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
