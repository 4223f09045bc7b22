"""SemCLIP on a user's data (the method: ``training.methods.semclip``).

Every caption of the training split (``caption`` and ``negatives`` records, "a photo of a
{label}" for labelled images) becomes a triplet written by the negation grammar's TRAINING forms
(``training.generate.grammar_triplets``): the phrase it names in a drawn negation form's
affirmative and negated captions ("the shirt is here." / "the shirt is not here."; a part named
with "with" / "without" by an attribute-negation form), and a paraphrase in a training paraphrase
form ("a picture of a shirt."). The held-out forms stay for the evaluation (docs/negation.md).
Image features are the frozen, cached pooled features; the loss is
``clipcore.methods.losses.semclip_loss``.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from model_store import Manifest
from training.distributed import is_main
from training.encode import Tokenize
from training.generate.grammar_triplets import caption_triplet
from training.methods import semclip
from training.userdata.context import RunContext, captioned_images
from training.userdata.publishing import data_summary, run_settings, text_variant_file
from training.userdata.settings import SemClipRun


def triplets(ctx: RunContext) -> tuple[list[int], list[str], list[str], list[str]]:
    """(caption index into ``captioned_images``, original, paraphrase, negation) of every caption,
    the forms drawn from the run's seed."""
    _, captions = captioned_images(ctx.dataset)
    rng = random.Random(ctx.seed)
    written = [caption_triplet(caption, rng) for caption in captions]
    if len(written) < 2:
        raise ValueError("SemCLIP needs at least two captions (docs/data.md)")
    return (list(range(len(written))), [t.original for t in written], [t.paraphrase for t in written],
            [t.negation for t in written])  # fmt: skip


def train_user_semclip(ctx: RunContext, cfg: SemClipRun) -> dict[str, torch.Tensor]:
    refs, _ = captioned_images(ctx.dataset)
    keep, orig, para, neg = triplets(ctx)
    ctx.log(f"semclip: {len(keep)} captions, each with a paraphrase and a negation in training forms")
    images = torch.from_numpy(ctx.features.of("pooled", [refs[i] for i in keep]))
    batch = min(cfg.batch_size, len(keep))

    def rows(step: int) -> np.ndarray:  # from the step: a resumed run sees the same batches
        return np.random.default_rng([ctx.seed, step, 31]).choice(len(keep), size=batch, replace=False)

    state, _ = semclip.train(
        ctx.bundle.model, semclip.TripletData(images, orig, para, neg), rows, cfg,
        tokenize=Tokenize.for_bundle(ctx.bundle), scale=ctx.bundle.logit_scale, runtime=ctx.runtime(),
        checkpoints=ctx.checkpoints("semclip", cfg.checkpoint_every, cfg.stop_after),
    )  # fmt: skip
    return state


def run_semclip(
    ctx: RunContext, cfg: SemClipRun, *, name: str | None = None, aliases: tuple[str, ...] = ()
) -> Manifest | None:
    """Train and publish a version with the base's parts and a ``semclip`` text encoder."""
    from training.derive import DerivedParts, publish_derived

    state = train_user_semclip(ctx, cfg)
    if (cfg.stop_after is not None and cfg.stop_after < cfg.steps) or not is_main():
        return None  # stopped early, or a torchrun rank other than 0 (rank 0 publishes)
    return publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files={"text_semclip.safetensors": text_variant_file(ctx, state)},
            text_encoders={"semclip": "text_semclip.safetensors"},
            training={
                "method": "semclip",
                "seed": ctx.seed,
                "device": ctx.device,
                "precision": ctx.precision,
                **run_settings(cfg),
            },
            data=data_summary(ctx.dataset, "user"),
            notes=f"SemCLIP on user data from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
