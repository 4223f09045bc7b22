"""Base CLIP training from scratch: one loop over a data source's batches.

The recipe (see docs/model_card.md for why each piece is there): AdamW with warm-up and cosine,
the text tower frozen at its random initialisation for the first ``text_freeze_steps`` (random
text embeddings act as fixed class targets and break the contrastive plateau), a FILIP-style
token-level term from ``filip_start`` on, an optional token-to-object mask alignment term (the
shapes world knows where each object is), autocast, gradient clipping and checkpoints every
``checkpoint_every`` steps and at the last step. The step loss is
``training.from_scratch.image_text_loss``; a data source gives each step's batch from the step
number (so a resumed run sees the same batches) and records what it keeps of each step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from clipcore.methods.losses import mask_alignment_loss
from training.from_scratch import image_text_loss, param_groups, set_text_trainable
from training.progress import StepProgress
from training.schedule import lr_at


@dataclass
class Hyper:
    """Base training's own hyperparameters (every data source's config has them)."""

    steps: int
    lr: float
    weight_decay: float
    warmup_steps: int
    text_freeze_steps: int
    filip_weight: float  # 0: no token-level term
    filip_start: int
    grad_clip: float
    checkpoint_every: int
    # Warm-up + cosine over ``schedule_steps`` (default: all steps); from ``phase2_start`` on,
    # a constant ``phase2_lr_frac * lr``.
    schedule_steps: int | None = None
    phase2_start: int | None = None
    phase2_lr_frac: float = 0.1
    align_weight: float = 0.0  # token-to-object mask alignment from ``align_start`` on
    align_start: int = 0
    align_temperature: float = 0.05


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
    device: str,
    checkpoint: Path,
    record: Record,
    end: int | None = None,
    amp: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    log: Callable[[str], None] = print,
) -> Result:
    """Train ``model`` in place for steps up to ``end`` (default ``hyper.steps``), resuming from
    ``checkpoint`` when it exists."""
    opt = torch.optim.AdamW(param_groups(model, hyper.weight_decay), lr=hyper.lr, betas=(0.9, 0.98), eps=1e-6)
    start: int = 0
    history: list[dict[str, Any]] = []
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        start, history = int(saved["step"]), list(saved["history"])
        log(f"base: resumed from step {start}")
    end = hyper.steps if end is None else end
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
            use_filip = hyper.filip_weight > 0 and step >= hyper.filip_start
            use_align = hyper.align_weight > 0 and step >= hyper.align_start and batch.alignment is not None
            with amp():
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
            if done % hyper.checkpoint_every == 0 or done == end:
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done, "history": history}
                torch.save(state, checkpoint.with_suffix(".tmp"))
                checkpoint.with_suffix(".tmp").replace(checkpoint)
    return Result(start, history, contrastive)
