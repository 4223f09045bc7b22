"""YUKINO on a user's data, the full method (``training.methods.yukino``): a text variant finetuned
from the base's text encoder, OTI pseudo-tokens as the inverter's teacher, and the inverter.

* Text finetune: from the base's default text encoder (or ``text_encoder``), each caption of the
  training split ("a photo of a {label}" for labelled images) against the frozen pooled features
  of its image; a user's data has no ground-truth structure, so there is no structure term. It is
  published as the ``yukino`` text encoder, which the inverter inverts into (``text.steps`` 0:
  no variant, the inverter inverts into the start encoder as it is).
* OTI: the first ``oti_items`` images (in a fixed order drawn from the seed), with the label
  names and their attribute values as concept words.
* Inverter: the matching loss on every caption, plus distillation toward OTI's tokens.

Dense image tokens come from the on-disk cache; every stage draws its rows from (seed, step) and
checkpoints in the run directory (``yukino_text``, ``yukino``), so a stopped run resumes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.yukino import YukinoHead
from model_store import Manifest
from training.encode import Tokenize, encode_texts
from training.generate.negatives import attribute_words
from training.methods import yukino
from training.userdata.context import RunContext, captioned_images
from training.userdata.publishing import data_summary, run_settings, text_variant_file
from training.userdata.settings import YukinoRun

VARIANT = "yukino"  # the text encoder the finetune publishes


@dataclass
class YukinoParts:
    head: YukinoHead
    text_state: dict[str, torch.Tensor] | None  # the finetuned variant (None: no finetune)


def rows_of(n: int, batch: int, seed: int, salt: int) -> yukino.Rows:
    def rows(step: int) -> torch.Tensor:  # from the step: a resumed run sees the same batches
        return torch.from_numpy(np.random.default_rng([seed, step, salt]).choice(n, size=batch, replace=False))

    return rows


def concept_words(ctx: RunContext) -> list[str]:
    """OTI's concept words: every word of the label names and of their attribute values."""
    words = {w for label in ctx.dataset.labels for w in label.lower().split()}
    return sorted(words | attribute_words(ctx.dataset.labels))


def finetuned_text(ctx: RunContext, cfg: YukinoRun, start: CLIP, refs: list, captions: list[str]) -> dict | None:
    """The text variant's state (None when ``text.steps`` is 0 or ``stop_after`` ends the run in it)."""
    if cfg.text.steps <= 0:
        return None
    images = torch.from_numpy(ctx.features.of("pooled", refs))
    data = yukino.TextData(Tokenize.for_bundle(ctx.bundle)(captions), images)
    stop = cfg.stop_after if cfg.stop_after is not None and cfg.stop_after < cfg.text.steps else None
    state, _ = yukino.finetune_text(
        start, data, rows_of(len(refs), min(cfg.batch_size, len(refs)), ctx.seed, 71), cfg.text,
        runtime=ctx.runtime(), checkpoints=ctx.checkpoints("yukino_text", cfg.checkpoint_every, stop),
    )  # fmt: skip
    return None if stop is not None else state


def train_user_yukino(ctx: RunContext, cfg: YukinoRun) -> YukinoParts | None:
    """The inverter and the text variant it inverts into (None when ``stop_after`` ended the run early)."""
    refs, captions = captioned_images(ctx.dataset)
    if len(refs) < 2:
        raise ValueError("YUKINO needs at least two captioned or labelled images (docs/data.md)")
    start_encoder = cfg.text_encoder or ctx.bundle.default_text_encoder
    text_model = ctx.bundle.text_model(start_encoder)
    text_state = finetuned_text(ctx, cfg, text_model, refs, captions)
    if cfg.text.steps > 0 and text_state is None:
        return None
    encoder = start_encoder
    if text_state is not None:
        text_model = copy.deepcopy(text_model)
        text_model.load_state_dict(text_state)
        encoder = VARIANT
    text_model = text_model.to(ctx.device).eval()
    for p in text_model.parameters():
        p.requires_grad_(False)
    tokenize = Tokenize.for_bundle(ctx.bundle)
    # The rows OTI teaches come first (the inverter's teacher covers rows 0..T-1).
    order = np.random.default_rng([ctx.seed, 67]).permutation(len(refs))
    refs, captions = [refs[i] for i in order], [captions[i] for i in order]
    tokens = torch.from_numpy(ctx.features.of("dense", refs))  # (N, 1+P, D) float16
    cap = encode_texts(text_model, tokenize, captions, device=ctx.device)
    teacher = None
    if cfg.oti_items > 0 and cfg.distill_weight > 0:
        concepts = yukino.concept_embeddings(text_model, tokenize, concept_words(ctx))
        taught = tokens[: cfg.oti_items, 0].float()
        teacher = yukino.oti(text_model, torch.nn.functional.normalize(taught, dim=-1), concepts, cfg.oti, ctx.device)
        ctx.log(f"yukino: OTI tokens of {len(teacher)} images")
    stop = None if cfg.stop_after is None else cfg.stop_after - max(cfg.text.steps, 0)
    head, _ = yukino.train_inverter(
        text_model, encoder, yukino.InverterData(tokens, cap, teacher),
        rows_of(len(refs), min(cfg.batch_size, len(refs)), ctx.seed, 61), cfg, runtime=ctx.runtime(),
        checkpoints=ctx.checkpoints("yukino", cfg.checkpoint_every, stop),
    )  # fmt: skip
    if stop is not None and stop < cfg.steps:
        return None
    return YukinoParts(head, text_state)


def run_yukino(
    ctx: RunContext, cfg: YukinoRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts, the ``yukino`` text encoder and a YUKINO
    inverter (None when ``stop_after`` ended the run early)."""
    from training.derive import DerivedParts, publish_derived

    parts = train_user_yukino(ctx, cfg)
    if parts is None:
        return None
    files, component = parts.head.to_files()
    text_encoders = {}
    if parts.text_state is not None:
        files[f"text_{VARIANT}.safetensors"] = text_variant_file(ctx, parts.text_state)
        text_encoders[VARIANT] = f"text_{VARIANT}.safetensors"
    return publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files=files,
            text_encoders=text_encoders,
            components={"yukino": component},
            training={"method": "yukino", "seed": ctx.seed, "device": ctx.device, **run_settings(cfg)},
            data=data_summary(ctx.dataset, "user"),
            notes=f"YUKINO on user data from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
