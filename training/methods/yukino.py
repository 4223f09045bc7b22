"""YUKINO's inverter: frozen class + patch tokens of an image -> a pseudo-token of a text encoder.

A data source gives the image tokens, the features of each image's caption in the frozen text
encoder and, optionally, teacher pseudo-tokens of its first images (``InverterData``), and the rows
each step reads (``Rows``). Each step applies YUKINO's matching loss (``yukino_matching_loss``:
each image's "a photo of $" minus "a photo of no $" picks its caption among the batch's, and each
caption its image) plus, where a row has a teacher token (OTI, shapes world), a distillation term.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from open_clip.model import CLIP

from clipcore.methods.losses import yukino_matching_loss
from clipcore.models.yukino import Inverter, YukinoHead, prompt_features
from training.progress import StepProgress
from training.schedule import lr_at

# Rows of one step (an index tensor).
Rows = Callable[[int], torch.Tensor]
Log = Callable[[str], None]


@dataclass
class InverterData:
    tokens: torch.Tensor  # (N, 1+P, D) normalised image tokens (float32 or float16)
    captions: torch.Tensor  # (N, D) normalised caption features in the text encoder
    teacher: torch.Tensor | None = None  # (T, W) pseudo-tokens of rows 0..T-1 (None: no distillation)


@dataclass
class Hyper:
    """The inverter's own hyperparameters (every data source's config has them)."""

    steps: int
    lr: float
    width: int
    scale: float
    distill_weight: float = 0.0


def train_inverter(
    text_model: CLIP,
    text_encoder: str,
    data: InverterData,
    rows: Rows,
    hyper: Hyper,
    *,
    seed: int,
    device: str,
    checkpoint: Path | None = None,
    checkpoint_every: int = 100,
    stop_after: int | None = None,
    log_every: int = 0,
    log: Log = print,
) -> tuple[YukinoHead, list[dict[str, float]]]:
    """The trained head (inverting into ``text_encoder``, the frozen ``text_model``) and the loss
    every 100 steps. With ``checkpoint`` it resumes from there and saves every ``checkpoint_every``."""
    torch.manual_seed(seed)
    token_dim = int(text_model.token_embedding.weight.shape[1])
    inverter = Inverter(data.tokens[0].numel(), token_dim, hyper.width).to(device)
    opt = torch.optim.AdamW(inverter.parameters(), lr=hyper.lr, weight_decay=0.01)
    start = 0
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        inverter.load_state_dict(saved["inverter"])
        opt.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    n_teacher = 0 if data.teacher is None else len(data.teacher)
    end = hyper.steps if stop_after is None else min(hyper.steps, stop_after)
    history: list[dict[str, float]] = []
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
            if log_every and (step + 1) % log_every == 0:
                log(f"yukino inverter step {step + 1}: {shown}")
            if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == end):
                state = {"inverter": inverter.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}
                torch.save(state, checkpoint.with_suffix(".tmp"))
                checkpoint.with_suffix(".tmp").replace(checkpoint)
    config = {"in_dim": data.tokens[0].numel(), "token_dim": token_dim, "width": hyper.width, "scale": hyper.scale}
    return YukinoHead(inverter.cpu().eval(), text_encoder, config), history
