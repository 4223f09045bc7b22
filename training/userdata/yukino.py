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

from clipcore.models.yukino import YukinoHead
from model_store import Manifest
from training.encode import Tokenize, encode_texts
from training.methods import yukino
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
    tokens = torch.from_numpy(ctx.features.of("dense", refs))  # (N, 1+P, D) float16
    cap = encode_texts(text_model, Tokenize.for_bundle(ctx.bundle), captions, device=ctx.device)
    n, batch = len(refs), min(cfg.batch_size, len(refs))

    def rows(step: int) -> torch.Tensor:  # from the step: a resumed run sees the same batches
        return torch.from_numpy(np.random.default_rng([ctx.seed, step, 61]).choice(n, size=batch, replace=False))

    hyper = yukino.Hyper(steps=cfg.steps, lr=cfg.lr, width=cfg.width, scale=cfg.scale)
    head, _ = yukino.train_inverter(
        text_model, encoder, yukino.InverterData(tokens, cap), rows, hyper, seed=ctx.seed, device=ctx.device,
        checkpoint=ctx.checkpoint("yukino"), checkpoint_every=cfg.checkpoint_every, stop_after=cfg.stop_after,
    )  # fmt: skip
    return head


def run_yukino(
    ctx: RunContext, cfg: YukinoRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts and a YUKINO inverter."""
    from training.derive import DerivedParts, publish_derived

    head = train_user_yukino(ctx, cfg)
    if cfg.stop_after is not None and cfg.stop_after < cfg.steps:
        return None
    files, component = head.to_files()
    return publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files=files,
            components={"yukino": component},
            training={"method": "yukino", "seed": ctx.seed, "device": ctx.device, **run_settings(cfg)},
            data=data_summary(ctx.dataset, "user"),
            notes=f"YUKINO on user data from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
