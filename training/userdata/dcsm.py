"""DCSM on a user's data (the method: ``training.methods.dcsm``): a scorer over the frozen dense
token x patch maps of the base version.

Each training item is an image, its caption and hard negatives of that caption: the user's
``negatives`` records as written; for ``caption`` records, rule-based edits
(``training.generate.negatives``: swapped attributes, flipped relations, toggled negation); for
labelled images, "a photo of a {label}" against the same caption with another label and its
rule-based edits. The
functional-word table is extended by the relation words the captions use. Dense image features
come from the on-disk cache; the distinct texts are encoded once per run. Each step scores every
image against its caption, one of its negatives and other items' captions, and every caption
against its image and other images (``dcsm.caption_negatives``: a user's hard negatives are
captions without images, unlike the shapes world's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clipcore.methods.dcsm import functional_row_table
from clipcore.models.dense import DenseEncoder, dcsm_component, dcsm_files
from model_store import Manifest
from training.datasets.records import CaptionRecord, LabelRecord, NegativesRecord
from training.datasets.source import ImageRef
from training.generate.differences import article
from training.generate.negatives import attribute_words, functional_groups_for, hard_negatives
from training.methods import dcsm
from training.methods.checkpoint import Checkpoints
from training.progress import StepProgress
from training.userdata.context import RunContext, items_of
from training.userdata.publishing import data_summary, run_settings
from training.userdata.settings import DCSMRun


@dataclass
class NegativeItems:
    images: list[ImageRef]
    captions: list[str]
    negatives: list[list[str]]
    generated: int  # items whose negatives were generated


def negative_items(ctx: RunContext) -> NegativeItems:
    out = NegativeItems([], [], [], 0)
    words = attribute_words(ctx.dataset.labels)
    labels = sorted(ctx.dataset.labels)
    rng = np.random.default_rng([ctx.seed, 3])
    for item in items_of(ctx.dataset, "negatives"):
        assert isinstance(item.record, NegativesRecord)
        out.images.append(item.images[0])
        out.captions.append(item.record.caption)
        out.negatives.append(list(item.record.negatives))
    for item in items_of(ctx.dataset, "caption"):
        assert isinstance(item.record, CaptionRecord)
        edits = list(hard_negatives(item.record.caption, words).values())
        if edits:
            out.images.append(item.images[0])
            out.captions.append(item.record.caption)
            out.negatives.append(edits)
            out.generated += 1
    for item in items_of(ctx.dataset, "label"):
        assert isinstance(item.record, LabelRecord)
        others = [lab for lab in labels if lab != item.record.label]
        if others:
            other = others[int(rng.integers(len(others)))]
            caption = f"a photo of {article(item.record.label)} {item.record.label}."
            out.images.append(item.images[0])
            out.captions.append(caption)
            # Another label, and the caption's own edits (its negation): a scorer that only ever
            # saw other labels learns nothing about "no" and may prefer the negated caption.
            out.negatives.append([f"a photo of {article(other)} {other}.", *hard_negatives(caption, words).values()])
            out.generated += 1
    if len(out.images) < 2:
        raise ValueError("DCSM needs at least two items with a caption and a hard negative (docs/data.md)")
    return out


def train_user_dcsm(ctx: RunContext, cfg: DCSMRun) -> tuple[dict[str, torch.Tensor], dict[str, Any], torch.Tensor]:
    """(scorer state, scorer config, functional-row table)."""
    data = negative_items(ctx)
    ctx.log(f"dcsm: {len(data.images)} items ({data.generated} with generated hard negatives)")
    images = torch.from_numpy(ctx.features.of("dense", data.images))  # (N, 1+P, D) float16
    n_positions = images.shape[1]
    grid = math.isqrt(n_positions - 1)
    if grid * grid != n_positions - 1:
        raise ValueError(f"DCSM needs a square patch grid; this tower gives {n_positions - 1} patches")
    groups = functional_groups_for(data.captions + [n for ns in data.negatives for n in ns])
    config = dcsm.scorer_config(n_positions, groups, cfg.table_seed, channels=cfg.channels, hidden=cfg.hidden)
    table = functional_row_table(config["functional_groups"], n_positions, cfg.table_seed)
    encoder = DenseEncoder(ctx.bundle.model, ctx.bundle.context_length, groups, int(config["length"]),
                           ctx.bundle.mean, ctx.bundle.std, device=ctx.device)  # fmt: skip
    distinct = list(dict.fromkeys(data.captions + [n for ns in data.negatives for n in ns]))
    where = {t: i for i, t in enumerate(distinct)}
    with StepProgress("dcsm texts", total=len(distinct)) as bar:
        texts = dcsm.encode_texts(encoder, distinct, 128, lambda n: bar.update(n))
    caption_row = torch.tensor([where[c] for c in data.captions])
    negative_rows = [[where[n] for n in ns] for ns in data.negatives]

    # A checkpoint of another scorer shape or functional-word table is not resumed.
    checkpoints = Checkpoints(ctx.checkpoint("dcsm"), cfg.checkpoint_every, cfg.stop_after, settings=config)
    step_loss = dcsm.caption_negatives(images, texts, caption_row, negative_rows, table, cfg,
                                       batch_size=cfg.batch_size, seed=ctx.seed, device=ctx.device)  # fmt: skip
    state, _ = dcsm.train(config, step_loss, cfg, runtime=ctx.runtime(), checkpoints=checkpoints)
    return state, config, table


def run_dcsm(
    ctx: RunContext, cfg: DCSMRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts and a DCSM scorer (None when
    ``stop_after`` ended the run early)."""
    from training.derive import DerivedParts, publish_derived

    state, config, table = train_user_dcsm(ctx, cfg)
    if cfg.stop_after is not None and cfg.stop_after < cfg.steps:
        return None
    return publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files=dcsm_files(state, config, table),
            components={"dcsm": dcsm_component(config)},
            training={"method": "dcsm", "seed": ctx.seed, "device": ctx.device, **run_settings(cfg)},
            data=data_summary(ctx.dataset, "user"),
            notes=f"DCSM on user data from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
