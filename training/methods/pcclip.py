"""PC-CLIP: finetune the text tower so f(T12) aligns with g(I1) - g(I2).

The image tower is frozen: a data source gives the image features of every pair and of the
captioned images once (``DifferenceData``), and which rows each step reads (``Batches``). Besides
the difference loss, the ordinary image-caption loss is kept at ``caption_weight`` (image side
frozen) so zero-shot accuracy does not drift. The loop itself is ``training.text_finetune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, cast

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.losses import clip_contrastive_loss, pcclip_difference_loss, weight_ensemble
from clipcore.models.clip_model import normalize, text_features
from training.distributed import sharded_features
from training.encode import Tokenize
from training.methods.checkpoint import Checkpoints, Runtime
from training.methods.hyper import PCClipHyper
from training.progress import loss_with_chance
from training.text_finetune import NO_CHECKPOINTS, finetune_text_tower

Hyper = PCClipHyper  # the method's hyperparameters (``training.methods.hyper``)


@dataclass
class DifferenceData:
    """Frozen image features of N pairs and their difference texts, and of M captioned images."""

    first: torch.Tensor  # (N, D) g(I1)
    second: torch.Tensor  # (N, D) g(I2)
    texts: list[str]  # N texts true of (I1, I2)
    caption_images: torch.Tensor | None  # (M, D)
    captions: list[str]  # M captions


class Batches(Protocol):
    """Rows of one step: pairs, and captioned images (None: no caption term this step)."""

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray | None]: ...


def kind_of(hyper: Hyper) -> str:
    """The difference loss: ``contrastive`` (InfoNCE over the batch's texts) or ``mse``."""
    return "mse" if hyper.loss == "mse" else "contrastive"


def train(
    base: CLIP,
    data: DifferenceData,
    batches: Batches,
    hyper: Hyper,
    *,
    tokenize: Tokenize,
    scale: float,
    runtime: Runtime,
    checkpoints: Checkpoints = NO_CHECKPOINTS,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """The finetuned model's state dict (text tower changed, image tower untouched) and its history;
    the last step's contrastive terms are logged beside their chance level."""
    device = runtime.device
    last: dict[str, tuple[float, int]] = {}  # term -> (loss, candidates) of the last step

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        idx, cidx = batches(step)

        def encode(texts: list[str]) -> torch.Tensor:
            return normalize(text_features(model, tokenize(texts).to(device))[0].float())

        # Under torchrun each rank encodes its slice of the batch; the loss sees all of it.
        f_t = sharded_features(encode, [data.texts[i] for i in idx])
        kind = cast(Literal["contrastive", "mse"], hyper.loss)
        loss = pcclip_difference_loss(
            data.first[idx].to(device), data.second[idx].to(device), f_t, temperature=hyper.temperature, kind=kind
        )
        last["difference"] = (loss.item(), len(idx))
        # The progress line shows the difference term alone, labelled, with its chance level.
        shown = (f"difference loss {loss_with_chance(loss.item(), len(idx))}" if kind == "contrastive"
                 else f"difference mse loss {loss.item():.3f}")  # fmt: skip
        if hyper.caption_weight > 0 and cidx is not None and data.caption_images is not None:
            f_c = sharded_features(encode, [data.captions[i] for i in cidx])
            caption = clip_contrastive_loss(data.caption_images[cidx].to(device), f_c, scale)
            last["caption"] = (caption.item(), len(cidx))
            loss = loss + hyper.caption_weight * caption
        return loss, shown

    state, history = finetune_text_tower(base, step_loss, steps=hyper.steps, lr=hyper.lr, label="pcclip",
                                         runtime=runtime, checkpoints=checkpoints)  # fmt: skip
    if last:
        terms = [f"{term} {loss_with_chance(value, n)}" for term, (value, n) in last.items()
                 if term == "caption" or kind_of(hyper) == "contrastive"]  # fmt: skip
        runtime.log("pcclip: last step's contrastive losses: " + ", ".join(terms))
    if hyper.ensemble_weight < 1.0:
        base_state = {k: v.detach().cpu() for k, v in base.state_dict().items()}
        state = weight_ensemble(base_state, state, hyper.ensemble_weight)
    return state, history
