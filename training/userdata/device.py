"""Where and how a training run on a user's data computes: the device, the arithmetic (autocast
precision) and the seed."""

from __future__ import annotations

import contextlib
import random
from typing import Any, Literal

import numpy as np
import torch

Precision = Literal["auto", "fp32", "bf16", "fp16"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``, and only when that device exists."""
    if device == "cpu":
        return device
    if not device.startswith("cuda") or (device != "cuda" and not device[5:].lstrip(":").isdigit()):
        raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    return device


def resolve_precision(precision: Precision, device: str) -> str:
    """``auto``: bf16 on a CUDA device that has it, else fp16 there; fp32 on CPU (text finetunes
    move by small steps that bf16's 8-bit mantissa loses)."""
    if precision != "auto":
        return precision
    if device.startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.split(":")[0], dtype=dtype)
