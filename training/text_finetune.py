"""The loop shared by the text-tower finetunes (PC-CLIP, SemCLIP, YUKINO's text encoder): image tower frozen.

Only the text tower trains (``is_trainable_text_param``: transformer, final norm, projection and
positional embedding, at the top level of a CLIP or under ``text.`` of a CustomTextCLIP/CoCa): the
token-embedding table stays shared with the base, which keeps a variant's file small.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from open_clip.model import CLIP

from clipcore.models.clip_model import is_trainable_text_param
from training.distributed import average_gradients, is_main
from training.methods.checkpoint import Checkpoints, Runtime, resumed
from training.progress import StepProgress
from training.schedule import lr_at

# One optimisation step's loss for the model being trained, and a short text for the progress bar.
StepLoss = Callable[[CLIP, int], tuple[torch.Tensor, str]]
NO_CHECKPOINTS = Checkpoints()


def finetune_text_tower(
    base: CLIP,
    step_loss: StepLoss,
    *,
    steps: int,
    lr: float,
    label: str,
    runtime: Runtime,
    checkpoints: Checkpoints = NO_CHECKPOINTS,
    extra: Sequence[torch.nn.Parameter] = (),
    extra_lr: float | None = None,
) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    """AdamW with warm-up and cosine decay; returns the finetuned state dict and the loss every 100 steps.

    ``extra``: parameters outside the model that ``step_loss`` uses (an auxiliary head), trained
    alongside at ``extra_lr`` (default ``lr``): a head that starts from scratch needs a far larger
    step than a pretrained tower that must not drift.

    ``checkpoints``: the trainable tensors, the extra parameters, the optimiser, the step and the
    history are saved there, and a run finding them resumes (the same result as an uninterrupted
    run when ``step_loss`` draws its batch from the step number). ``runtime.amp``: the autocast
    context of the forward passes.
    """
    torch.manual_seed(runtime.seed)
    model = copy.deepcopy(base).to(runtime.device)
    model.eval()  # no dropout / BN updates anywhere; gradients still flow
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(is_trainable_text_param(name))
        if p.requires_grad:
            params.append(p)
    groups = [{"params": params, "base_lr": lr}]
    if extra:
        groups.append({"params": list(extra), "base_lr": lr if extra_lr is None else extra_lr})
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.01)
    history: list[dict[str, float]] = []
    start = 0
    saved = checkpoints.load()
    if saved is not None:
        named = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in saved["params"].items():
                named[name].copy_(value)
            for p, value in zip(extra, saved["extra"], strict=True):
                p.copy_(value)
        opt.load_state_dict(saved["optimizer"])
        start, history = int(saved["step"]), list(saved["history"])
        resumed(label, start, runtime.log)

    end = checkpoints.end(steps)
    with StepProgress(label, total=steps, completed=start, enabled=is_main()) as bar:
        for step in range(start, end):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, lr=g["base_lr"], steps=steps, warmup_steps=20, warmup="overlap")
            with runtime.amp():
                loss, info = step_loss(model, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients([*params, *extra])  # across torchrun ranks; a no-op in one process
            torch.nn.utils.clip_grad_norm_(params, 1.0)  # the tower only: the head's steps are its own
            opt.step()
            bar.update(info=info)
            if (step + 1) % 100 == 0:
                history.append({"step": step + 1, "loss": loss.item()})
            if checkpoints.due(step + 1, end):
                checkpoints.save({
                    "params": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
                    "extra": [p.detach().cpu() for p in extra],
                    "optimizer": opt.state_dict(),
                    "step": step + 1,
                    "history": history,
                })  # fmt: skip
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, history
