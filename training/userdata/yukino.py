"""YUKINO on a user's data: the inverter from an image's frozen class + patch tokens to a pseudo-token.

The inverter (``clipcore.models.yukino.Inverter``) is trained with YUKINO's matching loss
(``yukino_matching_loss``: each image's "a photo of $" minus "a photo of no $" picks its caption
among the batch's, and each caption its image) on the user's captions ("a photo of a {label}" for
labelled images), in the input space of one frozen text encoder of the base version (its default,
or ``text_encoder``). Dense image tokens come from the on-disk cache. The per-image optimisation
(OTI) that teaches the shapes-world inverter is not run here: on a user's data it would need a
vocabulary of concept words for its regulariser, and the matching loss alone trains the inverter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clipcore.methods.losses import yukino_matching_loss
from clipcore.models.yukino import Inverter, YukinoHead, prompt_features
from model_store import Manifest
from training.encode import Tokenize, encode_texts
from training.progress import StepProgress
from training.schedule import lr_at
from training.userdata.context import RunContext, captioned_images
from training.userdata.publishing import data_summary, run_settings


@dataclass
class YukinoRun:
    steps: int = 500
    batch_size: int = 64
    lr: float = 3e-4
    width: int = 512
    scale: float = 100.0
    text_encoder: str | None = None  # default: the base's default text encoder
    checkpoint_every: int = 100
    stop_after: int | None = None


def train_user_yukino(ctx: RunContext, cfg: YukinoRun) -> YukinoHead:
    refs, captions = captioned_images(ctx.dataset)
    if len(refs) < 2:
        raise ValueError("YUKINO needs at least two captioned or labelled images (docs/data.md)")
    encoder = cfg.text_encoder or ctx.bundle.default_text_encoder
    text_model = ctx.bundle.text_model(encoder).eval()
    for p in text_model.parameters():
        p.requires_grad_(False)
    tokens = torch.from_numpy(ctx.features("dense", refs))  # (N, 1+P, D) float16
    cap = encode_texts(text_model, Tokenize.for_bundle(ctx.bundle), captions, device=ctx.device)
    torch.manual_seed(ctx.seed)
    token_dim = int(text_model.token_embedding.weight.shape[1])
    inverter = Inverter(tokens[0].numel(), token_dim, cfg.width).to(ctx.device)
    opt = torch.optim.AdamW(inverter.parameters(), lr=cfg.lr, weight_decay=0.01)
    start = 0
    path = ctx.checkpoint("yukino")
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=False)
        inverter.load_state_dict(saved["inverter"])
        opt.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    n, batch = len(refs), min(cfg.batch_size, len(refs))
    end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
    with StepProgress("yukino", total=cfg.steps, completed=start) as bar:
        for step in range(start, end):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, lr=cfg.lr, steps=cfg.steps)
            idx = torch.from_numpy(np.random.default_rng([ctx.seed, step, 61]).choice(n, size=batch, replace=False))
            v = inverter(tokens[idx].float().to(ctx.device))
            yes, no = prompt_features(text_model, v, text_model.context_length)
            loss = yukino_matching_loss(yes, no, cap[idx].to(ctx.device), cfg.scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            bar.update(info=f"loss {loss.item():.3f}")
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == end:
                state = {"inverter": inverter.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}
                torch.save(state, path.with_suffix(".tmp"))
                path.with_suffix(".tmp").replace(path)
    config = {"in_dim": tokens[0].numel(), "token_dim": token_dim, "width": cfg.width, "scale": cfg.scale}
    return YukinoHead(inverter.cpu().eval(), encoder, config)


def run_yukino(
    ctx: RunContext, cfg: YukinoRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts and a YUKINO inverter."""
    from training.derive import publish_derived

    head = train_user_yukino(ctx, cfg)
    if cfg.stop_after is not None and cfg.stop_after < cfg.steps:
        return None
    files, component = head.to_files()
    return publish_derived(
        ctx.store, ctx.bundle.ref, name=name, files=files, components={"yukino": component},
        training={"method": "yukino", "seed": ctx.seed, "device": ctx.device, **run_settings(cfg)},
        data=data_summary(ctx.dataset, "user"), aliases=aliases, notes=f"YUKINO on user data from {ctx.bundle.ref}",
    )  # fmt: skip
