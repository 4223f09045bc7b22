"""YUKINO: its text encoder, optimisation-based textual inversion (OTI) and the distilled inverter.

YUKINO matches captions in the linguistic space of a text encoder, which must tell apart captions
that differ only in which attribute belongs to which object, or in a relation. The method has
three stages, all here; a data source (the shapes world, ``training.train_yukino``, or a user's
data, ``training.userdata.yukino``) gives each stage its tensors and the rows each step reads:

* ``finetune_text``: a text variant finetuned from a start encoder (image tower frozen) with a
  contrastive loss between each caption and the frozen features of its image, each item's
  swapped twin left out of the negatives where the source has twins (pooled embeddings of a swap
  are near-identical, and contrasting them would pull the two captions back together); where the
  source knows each image's ground-truth structure (the shapes world's scenes), a contrastive
  term between each caption and that structure (``structure_encoder``, trained alongside, then
  dropped) makes swapped captions embed apart, and the image term is kept at ``image_weight``.
* ``oti``: per image, gradient steps on one pseudo-token ``v*`` under
  ``clipcore.methods.losses.yukino_oti_loss`` (yes prompt toward the image embedding, no prompt
  away, ``v*`` near the embeddings of the source's concept words). Slow: it is the teacher.
* ``train_inverter``: the 3-layer MLP from the image's class + patch tokens to ``v*``, trained
  with ``yukino_matching_loss`` (each image's "a photo of $" minus "a photo of no $" picks its
  caption among the batch's, and each caption its image), plus, on the rows OTI taught, a
  distillation term toward OTI's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from open_clip.model import CLIP

from clipcore.methods.losses import clip_contrastive_loss, yukino_matching_loss, yukino_oti_loss
from clipcore.models.clip_model import normalize, text_features
from clipcore.models.yukino import Inverter, YukinoHead, prompt_features
from training.encode import Tokenize
from training.methods.checkpoint import Checkpoints, Runtime, resumed
from training.methods.hyper import OTIHyper, TextHyper, YukinoHyper
from training.progress import StepProgress
from training.schedule import lr_at
from training.text_finetune import NO_CHECKPOINTS, finetune_text_tower

Hyper = YukinoHyper  # the method's hyperparameters (``training.methods.hyper``)

# Rows of one step (an index tensor).
Rows = Callable[[int], torch.Tensor]


@dataclass
class TextData:
    """What the text finetune reads: per row a caption's tokens and the frozen features of its
    image, optionally the row of its swapped twin and its ground-truth structure features."""

    tokens: torch.Tensor  # (N, L)
    images: torch.Tensor  # (N, D) normalised frozen image features
    twins: torch.Tensor | None = None  # (N,) row of each row's twin (-1: none)
    structure: torch.Tensor | None = None  # (N, F)


@dataclass
class InverterData:
    tokens: torch.Tensor  # (N, 1+P, D) normalised image tokens (float32 or float16)
    captions: torch.Tensor  # (N, D) normalised caption features in the text encoder
    teacher: torch.Tensor | None = None  # (T, W) pseudo-tokens of rows 0..T-1 (None: no distillation)


def structure_encoder(in_dim: int, out_dim: int, width: int = 256) -> torch.nn.Module:
    """The auxiliary head from a row's structure features to the text embedding space."""
    return torch.nn.Sequential(torch.nn.Linear(in_dim, width), torch.nn.GELU(), torch.nn.Linear(width, out_dim))


def finetune_text(
    start: CLIP,
    data: TextData,
    rows: Rows,
    hyper: TextHyper,
    *,
    runtime: Runtime,
    checkpoints: Checkpoints = NO_CHECKPOINTS,
    extra: torch.nn.Module | None = None,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """The text variant's state dict (from ``start``) and its history. ``extra``: the structure
    encoder when ``data.structure`` is given (default ``structure_encoder``)."""
    device = runtime.device
    torch.manual_seed(runtime.seed)
    head = None
    if data.structure is not None:
        head = (extra or structure_encoder(data.structure.shape[1], data.images.shape[1])).to(device)

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        idx = rows(step)
        feats = normalize(text_features(model, data.tokens[idx].to(device))[0].float())
        exclude = None
        if data.twins is not None:
            twins = data.twins[idx]
            exclude = (twins[None, :] == idx[:, None]) & (twins[None, :] >= 0)  # (i, j): j is i's twin
            exclude = exclude.to(device)
        image = clip_contrastive_loss(data.images[idx].to(device), feats, hyper.scale, exclude=exclude)
        if head is None or data.structure is None:
            return image, f"image {image.item():.3f}"
        struct = F.normalize(head(data.structure[idx].to(device)), dim=-1)
        scene = clip_contrastive_loss(struct, feats, hyper.scale)
        return scene + hyper.image_weight * image, f"scene {scene.item():.3f} image {image.item():.3f}"

    return finetune_text_tower(
        start, step_loss, steps=hyper.steps, lr=hyper.lr, label="yukino text", runtime=runtime,
        checkpoints=checkpoints, extra=[] if head is None else list(head.parameters()), extra_lr=hyper.structure_lr,
    )  # fmt: skip


def concept_embeddings(model: CLIP, tokenize: Tokenize, words: Sequence[str]) -> torch.Tensor:
    """Token embeddings of concept words (the first token of each, after the start token)."""
    ids = tokenize(list(words))[:, 1]
    return model.token_embedding.weight[ids].detach()


def oti(
    text_model: CLIP, targets: torch.Tensor, concepts: torch.Tensor, hyper: OTIHyper, device: str = "cpu"
) -> torch.Tensor:
    """Pseudo-tokens ``(N, W)`` for ``(N, D)`` normalised image embeddings, optimised per image."""
    concepts = concepts.to(device)
    for p in text_model.parameters():
        p.requires_grad_(False)
    out = []
    for i in range(0, len(targets), hyper.batch_size):
        out.append(_oti_batch(text_model, targets[i : i + hyper.batch_size].to(device), concepts, hyper))
    return torch.cat(out) if out else torch.empty(0, concepts.shape[1])


@torch.enable_grad()  # also when the caller (an evaluation) runs without gradients
def _oti_batch(text_model: CLIP, g: torch.Tensor, concepts: torch.Tensor, hyper: OTIHyper) -> torch.Tensor:
    v = concepts.mean(0, keepdim=True).repeat(len(g), 1).clone().requires_grad_(True)
    opt = torch.optim.Adam([v], lr=hyper.lr)
    for _ in range(hyper.steps):
        yes, no = prompt_features(text_model, v, text_model.context_length)
        loss = yukino_oti_loss(yes, no, g, v, concepts, hyper.margin, hyper.reg_weight).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return v.detach().cpu()


def train_inverter(
    text_model: CLIP,
    text_encoder: str,
    data: InverterData,
    rows: Rows,
    hyper: Hyper,
    *,
    runtime: Runtime,
    checkpoints: Checkpoints = NO_CHECKPOINTS,
) -> tuple[YukinoHead, list[dict[str, float]]]:
    """The trained head (inverting into ``text_encoder``, the frozen ``text_model``) and the loss
    every 100 steps."""
    device = runtime.device
    torch.manual_seed(runtime.seed)
    token_dim = int(text_model.token_embedding.weight.shape[1])
    inverter = Inverter(data.tokens[0].numel(), token_dim, hyper.width).to(device)
    opt = torch.optim.AdamW(inverter.parameters(), lr=hyper.lr, weight_decay=0.01)
    start = 0
    history: list[dict[str, float]] = []
    saved = checkpoints.load()
    if saved is not None:
        inverter.load_state_dict(saved["inverter"])
        opt.load_state_dict(saved["optimizer"])
        start, history = int(saved["step"]), list(saved.get("history", []))
        resumed("yukino", start, runtime.log)
    n_teacher = 0 if data.teacher is None else len(data.teacher)
    end = checkpoints.end(hyper.steps)
    with StepProgress("yukino", total=hyper.steps, completed=start) as bar:
        for step in range(start, end):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, lr=hyper.lr, steps=hyper.steps)
            idx = rows(step)
            v = inverter(data.tokens[idx].float().to(device))
            yes, no = prompt_features(text_model, v, text_model.context_length)
            matching = yukino_matching_loss(yes, no, data.captions[idx].to(device), hyper.scale)
            loss = matching
            taught = idx < n_teacher
            if hyper.distill_weight > 0 and data.teacher is not None and taught.any():
                distill = 1 - F.cosine_similarity(v[taught], data.teacher[idx[taught]].to(device), dim=-1).mean()
                loss = loss + hyper.distill_weight * distill
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            # Two contrastive sides over the batch's captions: chance is 2 ln(batch).
            shown = f"matching loss {matching.item():.3f} (chance: 2 ln {len(idx)} = {2 * math.log(len(idx)):.3f})"
            bar.update(info=shown)
            if (step + 1) % 100 == 0:
                history.append({"step": step + 1, "loss": loss.item()})
            if checkpoints.due(step + 1, end):
                checkpoints.save({"inverter": inverter.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                                  "history": history})  # fmt: skip
    config = {"in_dim": data.tokens[0].numel(), "token_dim": token_dim, "width": hyper.width, "scale": hyper.scale}
    return YukinoHead(inverter.cpu().eval(), text_encoder, config), history
