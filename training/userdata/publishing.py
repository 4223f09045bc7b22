"""Packaging what a run on user data trained as files and manifest entries of a derived version."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch

from clipcore.models.publish import tensor_bytes
from training.datasets.dataset import Dataset
from training.userdata.context import RunContext


def base_fp16(ctx: RunContext) -> bool:
    """Whether the base stores its weights in float16 (a variant is stored like its base)."""
    return ctx.bundle.components.weights_dtype == "float16"


def text_variant_file(ctx: RunContext, state: Mapping[str, torch.Tensor]) -> bytes:
    """The tensors of a finetuned text tower that differ from the base's (a variant's file)."""
    from clipcore.models.clip_model import is_text_param

    base = {k: v.detach().cpu() for k, v in ctx.bundle.model.state_dict().items()}
    delta = {k: v for k, v in state.items() if is_text_param(k) and not torch.equal(v.cpu(), base[k])}
    return tensor_bytes(delta, base_fp16(ctx))


def data_summary(dataset: Dataset, source: str, **extra: Any) -> dict[str, Any]:
    """What the manifest's ``data`` section records about a user's dataset."""
    return {
        "source": source,
        "records": dataset.counts(),
        "labels": len(dataset.labels),
        **extra,
    }


def run_settings(cfg: Any) -> dict[str, Any]:
    """A run configuration as the manifest stores it (JSON types: tuples become lists)."""
    return dict(json.loads(json.dumps(asdict(cfg))))
