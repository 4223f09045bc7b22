"""Base CLIP training from scratch: one loop over a data source's batches.

The recipe (see docs/model_card.md for why each piece is there): AdamW with warm-up and cosine,
the text tower frozen at its random initialisation for the first ``text_freeze_steps`` (random
text embeddings act as fixed class targets and break the contrastive plateau), a FILIP-style
token-level term from ``filip_start`` on, an optional token-to-object mask alignment term (the
shapes world knows where each object is), autocast, gradient clipping and checkpoints
(``training.methods.checkpoint``: the model, the optimiser, the step and the history). The step loss is
``training.from_scratch.image_text_loss``; a data source gives each step's batch from the step
number (so a resumed run sees the same batches) and records what it keeps of each step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from clipcore.methods.losses import mask_alignment_loss
from training.from_scratch import image_text_loss, param_groups, set_text_trainable
from training.methods.checkpoint import Checkpoints, Runtime, resumed
from training.methods.hyper import BaseHyper
from training.progress import StepProgress
from training.schedule import lr_at

Hyper = BaseHyper  # the method's hyperparameters (``training.methods.hyper``)


Alignment = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # rows, cols, targets


@dataclass
class Batch:
    """One step's normalised images and tokenised captions (on the CPU), and, where the source
    knows the objects, the mask-alignment targets of its tokens."""

    images: torch.Tensor
    tokens: torch.Tensor
    alignment: Callable[[torch.Tensor], Alignment] | None = None  # tokens (CPU) -> targets


class Batches(Protocol):
    def __call__(self, step: int) -> Batch: ...


class Record(Protocol):
    """After step ``done`` (1-based): append what the source keeps to ``history`` and return the
    progress line's text. ``loss`` is what was minimised (contrastive plus the FILIP and alignment
    terms when they are on); ``contrastive`` its image-text contrastive term alone, the one loss a
    progress line shows (with its chance level, ``training.progress.loss_with_chance``)."""

    def __call__(
        self, done: int, model: torch.nn.Module, loss: float, history: list[dict[str, Any]], contrastive: float
    ) -> str: ...


@dataclass
class Result:
    start: int  # the step the run resumed at (0: a fresh run)
    history: list[dict[str, Any]]
    contrastive: float  # the last step's image-text contrastive loss (nan when no step ran)


def train(
    model: torch.nn.Module,
    batches: Batches,
    hyper: Hyper,
    *,
    record: Record,
    checkpoints: Checkpoints,
    runtime: Runtime,
) -> Result:
    """Train ``model`` in place up to ``checkpoints.end(hyper.steps)``, resuming from its checkpoint."""
    device = runtime.device
    opt = torch.optim.AdamW(param_groups(model, hyper.weight_decay), lr=hyper.lr, betas=(0.9, 0.98), eps=1e-6)
    start: int = 0
    history: list[dict[str, Any]] = []
    saved = checkpoints.load()
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        start, history = int(saved["step"]), list(saved["history"])
        resumed("base", start, runtime.log)
    end = checkpoints.end(hyper.steps)
    filip_start = hyper.text_freeze_steps if hyper.filip_start is None else hyper.filip_start
    contrastive = float("nan")
    with StepProgress("base", total=hyper.steps, completed=start) as bar:
        for step in range(start, end):
            batch = batches(step)
            model.train()
            set_text_trainable(model, step >= hyper.text_freeze_steps)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, lr=hyper.lr, steps=hyper.schedule_steps or hyper.steps,
                                warmup_steps=hyper.warmup_steps, phase2_start=hyper.phase2_start,
                                phase2_lr_frac=hyper.phase2_lr_frac)  # fmt: skip
            images, tokens = batch.images.to(device), batch.tokens.to(device)
            use_filip = hyper.filip_weight > 0 and step >= filip_start
            use_align = hyper.align_weight > 0 and step >= hyper.align_start and batch.alignment is not None
            with runtime.amp():
                loss, contrastive, img_tok, txt_tok = image_text_loss(
                    model,
                    images,
                    tokens,
                    filip_weight=hyper.filip_weight,
                    filip=use_filip,
                    dense=use_filip or use_align,
                )
                if use_align:
                    assert img_tok is not None and txt_tok is not None and batch.alignment is not None
                    rows, cols, targets = batch.alignment(tokens.cpu())
                    loss = loss + hyper.align_weight * mask_alignment_loss(
                        img_tok[:, 1:].float(), txt_tok.float(), rows.to(device), cols.to(device), targets,
                        hyper.align_temperature,
                    )  # fmt: skip
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), hyper.grad_clip)
            opt.step()
            done = step + 1
            bar.update(info=record(done, model, loss.item(), history, contrastive))
            if checkpoints.due(done, end):
                checkpoints.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done,
                                  "history": history})  # fmt: skip
    return Result(start, history, contrastive)
