"""Data-parallel training across processes (``torchrun --nproc_per_node N``): gloo on CPU, NCCL on CUDA.

A run under torchrun has ``WORLD_SIZE`` > 1 in its environment; ``setup`` then joins the process
group and every helper below acts across ranks. Without torchrun every helper is the identity, so
the same code runs in one process unchanged.

The finetunes are written so N ranks compute what one process computes on the same global batch:

- every rank draws the same global batch (same seed), and encodes its own contiguous slice of it
  (``local_slice``);
- the slices' features are gathered with gradients (``gather_with_grad``, as open_clip does for
  contrastive losses), so every rank computes the loss over the whole global batch, and its
  negatives come from every rank;
- the backward pass of the gather sums each slice's gradient over the N identical losses, and
  ``average_gradients`` divides the parameters' gradients summed over ranks by N: the result is the
  single-process gradient of the global batch (what ``DistributedDataParallel`` averaging gives).

Frozen features (the embedding precompute) are computed by each rank on its own shard of the
images and gathered (``gather_rows``); only rank 0 writes files and publishes (``is_main``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

T = TypeVar("T")
S = TypeVar("S", bound="Sequence[Any] | np.ndarray")  # a list, a tuple or an array: sliced as it is


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher) with more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: str = "cpu", timeout_s: float = 300.0) -> tuple[World, str]:
    """Join the process group when launched with several ranks; returns the world and the device
    this rank uses (``cuda:<local rank>`` on CUDA). A no-op in a single process."""
    if not launched():
        return World(), device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", timeout=timedelta(seconds=timeout_s))
    return World(dist.get_rank(), dist.get_world_size(), local_rank), device


def world() -> World:
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def is_main() -> bool:
    return world().main


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def local_slice(n: int) -> slice:
    """This rank's contiguous part of a global batch of ``n`` (``n`` must divide evenly, so that
    every rank holds the same number of rows and the gathered batch is the global one, in order)."""
    w = world()
    if n % w.size:
        raise ValueError(f"the global batch ({n}) must be a multiple of the number of ranks ({w.size})")
    per = n // w.size
    return slice(w.rank * per, (w.rank + 1) * per)


def shard(items: S) -> S:
    """This rank's share of ``items`` (every ``size``-th item from ``rank``): for reading data."""
    w = world()
    return items[w.rank :: w.size]  # type: ignore[return-value]


def sharded_features(encode: Callable[[list[T]], torch.Tensor], batch: Sequence[T]) -> torch.Tensor:
    """Features of the whole global ``batch``: this rank encodes its slice, the slices of every
    rank are gathered with gradients (a single process encodes the whole batch)."""
    return gather_with_grad(encode(list(batch[local_slice(len(batch))])))


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sums each part's gradient over the ranks (a reduce-scatter):
    ``torch.distributed.nn.functional.all_gather``, which newer torch marks deprecated."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        w = world()
        parts = [torch.empty_like(x) for _ in range(w.size)]
        dist.all_gather(parts, x.contiguous())
        ctx.rows = (w.rank * x.shape[0], (w.rank + 1) * x.shape[0])  # type: ignore[attr-defined]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        total = grad.contiguous().clone()
        dist.all_reduce(total)
        start, end = ctx.rows  # type: ignore[attr-defined]
        return total[start:end]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Every rank's ``x`` concatenated in rank order (all the same shape); gradients flow back to
    each rank's part, summed over the ranks' losses."""
    if world().size == 1:
        return x
    return _GatherWithGrad.apply(x)  # type: ignore[no-any-return]


@torch.no_grad()
def gather_rows(x: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """Rows computed by each rank (``counts[r]`` rows on rank ``r``) concatenated in rank order,
    without gradients; ranks may hold different numbers of rows."""
    w = world()
    if w.size == 1:
        return x
    width = max(counts)
    padded = torch.zeros((width, *x.shape[1:]), dtype=x.dtype, device=x.device)
    padded[: len(x)] = x
    parts = [torch.empty_like(padded) for _ in range(w.size)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])


def unshard(parts: torch.Tensor, n: int) -> torch.Tensor:
    """Undo ``shard`` after ``gather_rows``: row ``i`` of the result is item ``i``."""
    w = world()
    if w.size == 1:
        return parts
    order = torch.cat([torch.arange(r, n, w.size) for r in range(w.size)])
    out = torch.empty_like(parts)
    out[order] = parts
    return out


def map_sharded(fn: Callable[[S], torch.Tensor], items: S) -> torch.Tensor:
    """``fn(items)`` computed by each rank on its own shard and gathered on every rank, in item
    order (the embedding precompute: each rank reads and encodes only its share of the images)."""
    w = world()
    if w.size == 1:
        return fn(items)
    n = len(items)
    local = fn(shard(items))
    # NCCL gathers CUDA tensors only; gloo CPU ones.
    device = torch.device(f"cuda:{w.local_rank}") if dist.get_backend() == "nccl" else torch.device("cpu")
    counts = [len(range(r, n, w.size)) for r in range(w.size)]
    return unshard(gather_rows(local.to(device), counts), n).to(local.device)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """All-reduce and average the gradients of ``params`` (what DDP does after backward)."""
    w = world()
    if w.size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= w.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_across_ranks(value: float) -> float:
    w = world()
    if w.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / w.size
