"""SemCLIP: finetune the text tower so paraphrases stay close and negations move away.

A data source gives the frozen image features of N captioned images with each caption's
paraphrase and negation (``TripletData``) and the rows each step reads (``Rows``). Each step
minimises ``clipcore.methods.losses.semclip_loss`` in a fixed random projection subspace. Weights
``(a, b, c)`` of (clip, paraphrase, negation) give the ablations: ``(1, 1, 0)`` is paraphrase-only,
``(1, 0, 1)`` negation-only. The loop itself is ``training.text_finetune``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.losses import semclip_loss
from clipcore.methods.semclip import projection_directions
from clipcore.models.clip_model import embed_width, normalize, text_features
from training.distributed import sharded_features
from training.encode import Tokenize
from training.methods.checkpoint import Checkpoints, Runtime
from training.methods.hyper import SemClipHyper
from training.text_finetune import NO_CHECKPOINTS, finetune_text_tower

Hyper = SemClipHyper  # the method's hyperparameters (``training.methods.hyper``)

# Rows of one step: which triplets it reads.
Rows = Callable[[int], np.ndarray]


@dataclass
class TripletData:
    images: torch.Tensor  # (N, D) frozen image features
    original: list[str]  # N captions
    paraphrase: list[str]
    negation: list[str]


def train(
    base: CLIP,
    data: TripletData,
    rows: Rows,
    hyper: Hyper,
    *,
    tokenize: Tokenize,
    scale: float,
    runtime: Runtime,
    checkpoints: Checkpoints = NO_CHECKPOINTS,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """The finetuned state dict (text tower changed, image tower untouched) and its history."""
    seed, device = runtime.seed, runtime.device
    directions = torch.from_numpy(projection_directions(embed_width(base), hyper.directions, seed)).to(device)

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        idx = rows(step)

        def encode(texts: list[str]) -> torch.Tensor:
            return normalize(text_features(model, tokenize(texts).to(device))[0].float())

        # Under torchrun each rank encodes its slice of the batch; the loss sees all of it.
        t, tp, tn = (sharded_features(encode, [texts[i] for i in idx])
                     for texts in (data.original, data.paraphrase, data.negation))  # fmt: skip
        loss, parts = semclip_loss(data.images[idx].to(device), t, tp, tn, directions, scale, hyper.weights,
                                   hyper.normalise, hyper.negatives_in_clip)  # fmt: skip
        return loss, " ".join(f"{k} {v:.3f}" for k, v in parts.items())

    return finetune_text_tower(base, step_loss, steps=hyper.steps, lr=hyper.lr, label="semclip", runtime=runtime,
                               checkpoints=checkpoints)  # fmt: skip
