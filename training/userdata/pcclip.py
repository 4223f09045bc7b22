"""PC-CLIP on a user's data (the method: ``training.methods.pcclip``).

Pairs come from the user's ``pair`` records and, where the dataset has labelled images, from
generated difference texts (``training.generate.differences``: "The first image shows a coat,
while the second shows a shirt.", both orders). The ordinary image-caption loss is kept at a small
weight on the user's captions (and "a photo of a {label}" for labelled images), so zero-shot
accuracy does not drift. Image features are the frozen, cached pooled features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_store import Manifest
from training.datasets.records import PairRecord
from training.datasets.source import ImageRef
from training.distributed import is_main
from training.encode import Tokenize
from training.generate.differences import pairs_from_labels
from training.methods import pcclip
from training.userdata.context import RunContext, captioned_images, items_of
from training.userdata.publishing import data_summary, run_settings, text_variant_file
from training.userdata.settings import PCClipRun


@dataclass
class PairData:
    first: list[ImageRef]
    second: list[ImageRef]
    texts: list[str]
    generated: int


def difference_pairs(ctx: RunContext, cfg: PCClipRun) -> PairData:
    """The training split's pair records, plus pairs generated from its labelled images."""
    data = PairData([], [], [], 0)
    for item in items_of(ctx.dataset, "pair"):
        assert isinstance(item.record, PairRecord)
        data.first.append(item.images[0])
        data.second.append(item.images[1])
        data.texts.append(item.record.difference)
    labelled = items_of(ctx.dataset, "label")
    if cfg.generated_pairs > 0 and len({i.record.label for i in labelled}) >= 2:  # type: ignore[union-attr]
        for pair in pairs_from_labels(labelled, ctx.dataset.labels, cfg.generated_pairs // 2, ctx.seed):
            data.first.append(pair.first.images[0])
            data.second.append(pair.second.images[0])
            data.texts.append(pair.difference)
            data.generated += 1
    if not data.texts:
        raise ValueError("PC-CLIP needs pair records or labelled images of at least two labels (docs/data.md)")
    return data


def train_user_pcclip(ctx: RunContext, cfg: PCClipRun) -> dict[str, torch.Tensor]:
    """The finetuned model's state dict (text tower changed, image tower untouched)."""
    pairs = difference_pairs(ctx, cfg)
    ctx.log(f"pcclip: {len(pairs.texts)} pairs ({pairs.generated} with generated difference texts)")
    g1 = torch.from_numpy(ctx.features.of("pooled", pairs.first))
    g2 = torch.from_numpy(ctx.features.of("pooled", pairs.second))
    cap_refs, cap_texts = captioned_images(ctx.dataset)
    g_cap = torch.from_numpy(ctx.features.of("pooled", cap_refs)) if cap_refs else None
    n, batch = len(pairs.texts), min(cfg.batch_size, len(pairs.texts))
    captions = cfg.caption_weight > 0 and g_cap is not None and len(cap_texts) >= 2

    def batches(step: int) -> tuple[np.ndarray, np.ndarray | None]:
        rng = np.random.default_rng([ctx.seed, step, 11])  # from the step: a resumed run sees the same batches
        idx = rng.choice(n, size=batch, replace=False)
        cidx = rng.choice(len(cap_texts), size=min(batch, len(cap_texts)), replace=False) if captions else None
        return idx, cidx

    state, _ = pcclip.train(
        ctx.bundle.model, pcclip.DifferenceData(g1, g2, pairs.texts, g_cap, cap_texts), batches, cfg,
        tokenize=Tokenize.for_bundle(ctx.bundle), scale=ctx.bundle.logit_scale, runtime=ctx.runtime(),
        checkpoints=ctx.checkpoints("pcclip", cfg.checkpoint_every, cfg.stop_after),
    )  # fmt: skip
    return state


def run_pcclip(
    ctx: RunContext, cfg: PCClipRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts and a ``pcclip`` text encoder (None when
    ``stop_after`` ended the run early: resume it to publish)."""
    from training.derive import DerivedParts, publish_derived

    state = train_user_pcclip(ctx, cfg)
    if (cfg.stop_after is not None and cfg.stop_after < cfg.steps) or not is_main():
        return None  # stopped early, or a torchrun rank other than 0 (rank 0 publishes)
    components = {"default_text_encoder": "pcclip"} if cfg.make_default else {}
    return publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files={"text_pcclip.safetensors": text_variant_file(ctx, state)},
            text_encoders={"pcclip": "text_pcclip.safetensors"},
            components=components,
            training={
                "method": "pcclip",
                "seed": ctx.seed,
                "device": ctx.device,
                "precision": ctx.precision,
                **run_settings(cfg),
            },
            data=data_summary(ctx.dataset, "user"),
            notes=f"PC-CLIP on user data from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
