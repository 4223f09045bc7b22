"""DCSM: a scorer trained on the frozen dense token x patch features of a CLIP.

The CLIP is frozen, so a data source computes the dense features of its images and of its
distinct texts once (``DenseTexts``, image tensors) and the scorer trains from those tensors
(``train``). A step's loss comes from one of two options, because the two data sources hold
different hard negatives:

- ``in_batch_pairs`` (the shapes world): every hard-negative caption comes with an image it is
  true of (the scene with the edit applied), so an item is two anchors, image/caption and hard
  negative image/caption, and each anchor's hard negative is the other anchor
  (``dcsm_batch_loss``). Batches are epochs over a fixed permutation.
- ``caption_negatives`` (a user's data): hard negatives are captions only (written ``negatives``
  records, rule-based edits, other labels), possibly several per caption and no image of them,
  so every image is scored against its caption, one of its negatives drawn per step and other
  items' captions, and every caption against its image and other images
  (``dcsm_caption_negatives_loss``). Each step draws its batch from the step number, so a run
  resumes at any step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from clipcore.methods.dcsm import DEFAULT_SCORER_CONFIG, DCSMScorer, dcsm_scores, prepare_maps
from clipcore.methods.losses import dcsm_batch_loss, dcsm_caption_negatives_loss
from clipcore.models.dense import DenseEncoder
from training.progress import StepProgress
from training.schedule import lr_at


@dataclass
class Hyper:
    """DCSM's own hyperparameters (every data source's config has them)."""

    steps: int  # the schedule's length
    lr: float
    weight_decay: float
    warmup_steps: int
    k_random: int  # random in-batch candidates per anchor and side


@dataclass
class DenseTexts:
    """Dense token features of distinct texts."""

    tokens: torch.Tensor  # (U, L, D) fp16
    valid: torch.Tensor  # (U, L) bool
    rows: torch.Tensor  # (U, L) long


def encode_texts(
    encoder: DenseEncoder, texts: Sequence[str], batch: int, done: Callable[[int], None] = lambda _: None
) -> DenseTexts:
    """``texts``' dense features in chunks of ``batch`` (``done`` told each chunk's size)."""
    tok_parts, valid_parts, row_parts = [], [], []
    for i in range(0, len(texts), batch):
        tok, valid, rows = encoder.text_tokens(list(texts[i : i + batch]))
        tok_parts.append(tok.half())
        valid_parts.append(valid)
        row_parts.append(rows)
        done(len(tok))
    return DenseTexts(torch.cat(tok_parts), torch.cat(valid_parts), torch.cat(row_parts))


def scorer_config(
    n_positions: int, functional_groups: Mapping[str, Sequence[str]], table_seed: int, **scorer: Any
) -> dict[str, Any]:
    """Everything needed to rebuild the scorer and its inputs (stored with the weights)."""
    return {
        **DEFAULT_SCORER_CONFIG,
        **scorer,
        "grid": math.isqrt(n_positions - 1),
        "functional_groups": {g: list(w) for g, w in functional_groups.items()},
        "table_seed": table_seed,
    }


@dataclass
class DenseItems:
    """Items with a hard-negative image in memory: row 2i is item i's image/caption, row 2i+1 its
    hard negative (not the on-disk frozen-feature cache, ``training.feature_cache``)."""

    images: torch.Tensor  # (2N, 1+P, D) fp16
    texts: DenseTexts  # distinct captions
    text_index: torch.Tensor  # (2N,) row of each anchor's caption in ``texts``
    kinds: list[str]  # per item

    def batch(self, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t = self.text_index[anchors]
        return self.images[anchors].float(), self.texts.tokens[t].float(), self.texts.valid[t], self.texts.rows[t]


@torch.no_grad()
def two_way_accuracy(scorer: DCSMScorer, items: DenseItems, table: torch.Tensor, chunk: int = 1024) -> dict[str, float]:
    """Per kind: share of items whose image scores its caption above the hard negative."""
    scorer.eval()
    n = len(items.kinds)
    wins = []
    texts = items.texts
    for i in range(0, n, chunk):
        rows = torch.arange(i, min(n, i + chunk))
        img = items.images[2 * rows].float()
        pos_t, neg_t = items.text_index[2 * rows], items.text_index[2 * rows + 1]
        s = []
        for t in (pos_t, neg_t):
            maps = prepare_maps(img, texts.tokens[t].float(), texts.valid[t], texts.rows[t], table)
            s.append(dcsm_scores(scorer, maps))
        wins.append(s[0] > s[1])
    win = torch.cat(wins).numpy()
    kinds = np.array(items.kinds)
    out = {k: float(win[kinds == k].mean()) for k in dict.fromkeys(items.kinds)}
    out["all"] = float(win.mean())
    return out


class StepLoss(Protocol):
    """One step's loss and fit (share of anchors ranking their own text first)."""

    def __call__(self, scorer: DCSMScorer, step: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def in_batch_pairs(
    items: DenseItems,
    table: torch.Tensor,
    hyper: Hyper,
    *,
    batch_size: int,
    steps_per_epoch: int,
    seed: int,
    device: str,
) -> StepLoss:
    """Epochs over a permutation of the items seeded by the epoch (a resumed epoch sees the same
    batches); each item is two anchors, each the other's hard negative."""
    n = len(items.kinds)
    gen = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)

    def step_loss(scorer: DCSMScorer, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal order
        epoch, s = divmod(step, steps_per_epoch)
        if s == 0 or len(order) == 0:  # an epoch's start, or a run resumed within an epoch
            gen.manual_seed(seed * 1000 + epoch)
            order = torch.randperm(n, generator=gen)
        rows = order[s * batch_size : (s + 1) * batch_size]
        anchors = torch.stack([2 * rows, 2 * rows + 1], dim=1).reshape(-1)
        img, txt, valid, text_rows = (x.to(device) for x in items.batch(anchors))
        return dcsm_batch_loss(scorer, img, txt, valid, text_rows, table, hyper.k_random, gen)

    return step_loss


def caption_negatives(
    images: torch.Tensor,
    texts: DenseTexts,
    caption_row: torch.Tensor,
    negative_rows: list[list[int]],
    table: torch.Tensor,
    hyper: Hyper,
    *,
    batch_size: int,
    seed: int,
    device: str,
) -> StepLoss:
    """Batches drawn from the step number (resumable at any step); ``images`` (N, 1+P, D),
    ``caption_row[i]`` / ``negative_rows[i]``: rows in ``texts`` of item i's caption and negatives."""
    n = len(images)
    batch = min(batch_size, n)
    k = min(hyper.k_random, batch - 1)

    def step_loss(scorer: DCSMScorer, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([seed, step, 13])
        torch.manual_seed(int(rng.integers(2**31)))  # dropout masks too
        idx = rng.choice(n, size=batch, replace=False)
        # k other batch positions per position j (never j itself).
        picks = [rng.permutation(batch - 1)[:k] for _ in range(batch)]
        others = np.stack([o + (o >= j) for j, o in enumerate(picks)]).astype(np.int64)
        cand = [[int(caption_row[i]), negative_rows[i][int(rng.integers(len(negative_rows[i])))]] for i in idx]
        for j in range(batch):
            cand[j] += [int(caption_row[idx[o]]) for o in others[j]]
        cand_t = torch.tensor(cand)
        image_cand = torch.cat([torch.arange(batch)[:, None], torch.from_numpy(others).long()], dim=1)
        return dcsm_caption_negatives_loss(
            scorer, images[idx].float().to(device), texts.tokens[cand_t].float().to(device),
            texts.valid[cand_t].to(device), texts.rows[cand_t].to(device), image_cand.to(device), table.to(device),
        )  # fmt: skip

    return step_loss


AfterStep = Callable[[int, DCSMScorer, torch.optim.Optimizer, float, float], None]


def train(
    config: dict[str, Any],
    step_loss: StepLoss,
    hyper: Hyper,
    *,
    seed: int,
    device: str,
    start: int = 0,
    end: int | None = None,
    resume: tuple[dict[str, Any], dict[str, Any]] | None = None,
    after_step: AfterStep | None = None,
    info: Callable[[int, float, float], str] = lambda _step, loss, fit: f"loss {loss:.3f} fit {fit:.2f}",
) -> dict[str, torch.Tensor]:
    """Train a scorer built from ``config`` for steps ``start`` to ``end`` (default ``hyper.steps``)
    of a warm-up-then-cosine schedule over ``hyper.steps``; its state dict.

    ``resume``: (scorer state, optimizer state) of a checkpoint taken after step ``start``.
    ``after_step(step, scorer, optimizer, loss, fit)`` runs after every optimizer step (history,
    validation, checkpoints); what it changes in the scorer's mode it restores."""
    torch.manual_seed(seed)
    scorer = DCSMScorer(config).to(device)
    opt = torch.optim.AdamW(scorer.parameters(), lr=hyper.lr, weight_decay=hyper.weight_decay)
    if resume is not None:
        scorer.load_state_dict(resume[0])
        opt.load_state_dict(resume[1])
    end = hyper.steps if end is None else end
    scorer.train()
    with StepProgress("dcsm", total=hyper.steps, completed=start) as bar:
        for step in range(start, end):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, lr=hyper.lr, steps=hyper.steps, warmup_steps=hyper.warmup_steps, warmup="overlap")
            loss, acc = step_loss(scorer, step)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), 1.0)
            opt.step()
            value, fit = loss.item(), acc.item()
            if after_step is not None:
                after_step(step, scorer, opt, value, fit)
            bar.update(info=info(step, value, fit))
    return {k: v.detach().cpu() for k, v in scorer.state_dict().items()}
