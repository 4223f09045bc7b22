"""The torch int8 backend: the image tower's matrix products in int8, on torch's own CPU kernels.

Every ``nn.Linear`` of the image tower, and the input and output projections of its self-attention
blocks, become dynamically quantised linears (``torch.ao.nn.quantized.dynamic.Linear``): weights
int8 per output channel, made once when the version loads; activations quantised per call.
torch runs them on fbgemm (x86 engine) or qnnpack (ARM). Convolutions, norms, the attention
softmax and the final projection stay fp32, and so do the text towers and DCSM's dense features,
as with the ONNX int8 graph.

Why it is portable: torch's dynamic linear quantises activations to 7 bits (``reduce_range``), so
on CPUs without VNNI the AVX2 kernel's int16 pair sums (``vpmaddubsw``) cannot saturate, the fault
that once made int8 answers differ by CPU kind. fbgemm picks its kernels by CPUID; the environment
variable ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2`` makes it use the AVX2 ones on any x86-64 CPU, which is
how the tests and ``loadtests.bench_backends`` check and time that path on an AVX-512 machine.

No export and no second runtime: quantising a ViT-B/32 tower takes about a second, against a
minute for an ONNX int8 export. The parity gate (``require_parity``) still decides whether it serves.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Collection

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from clipcore.backends.base import BackendError
from clipcore.models.bundle import ModelBundle
from clipcore.models.encoding import encode_pixels


def has_int8_engine() -> bool:
    """Whether this torch build has a quantised CPU engine (x86 / fbgemm, or qnnpack on ARM)."""
    return torch.backends.quantized.engine != "none"


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> DynamicInt8Linear:
    """A dynamically quantised linear computing ``x @ weight.T + bias`` (weights per output channel)."""
    float_linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        float_linear.weight.copy_(weight)
        if bias is not None:
            float_linear.bias.copy_(bias)
    float_linear.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig  # type: ignore[assignment]
    with warnings.catch_warnings():
        # torch marks its quantised-tensor API for a future removal; until then it is the int8 CPU
        # kernel torch ships. If it goes, building raises, and auto refuses this candidate.
        warnings.simplefilter("ignore", UserWarning)
        return DynamicInt8Linear.from_float(float_linear)


class Int8SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` for self-attention with int8 projections and fp32 softmax.

    Called as the block calls the original (``attn(x, x, x, need_weights=False)[0]``). Any other
    use (cross-attention, masks, attention weights) goes to the original fp32 module, kept for it.
    """

    def __init__(self, attention: nn.MultiheadAttention) -> None:
        super().__init__()
        self.heads, self.batch_first = attention.num_heads, attention.batch_first
        self.qkv = int8_linear(attention.in_proj_weight, attention.in_proj_bias)
        self.out = int8_linear(attention.out_proj.weight, attention.out_proj.bias)
        self.fp32 = attention

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if need_weights or attn_mask is not None or kwargs or not (query is key is value):
            return self.fp32(query, key, value, need_weights=need_weights, attn_mask=attn_mask, **kwargs)
        x = query if self.batch_first else query.transpose(0, 1)
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        y = self.out(y.transpose(1, 2).reshape(batch, length, width))
        return (y if self.batch_first else y.transpose(0, 1)), None


def quantize_tower(tower: nn.Module) -> nn.Module:
    """A copy of ``tower`` whose linears and self-attention projections multiply in int8.

    Only the modules are copied: parameters and buffers stay the version's own, shared (what is
    not quantised, and the fp32 fallback of each attention, costs no memory)."""
    shared = {id(t): t for t in (*tower.parameters(), *tower.buffers())}
    tower = copy.deepcopy(tower, memo=shared)
    for parent in list(tower.modules()):  # a snapshot: the loop replaces children as it goes
        for name, child in parent.named_children():
            if isinstance(child, nn.MultiheadAttention) and child.in_proj_weight is not None:
                setattr(parent, name, Int8SelfAttention(child))
            elif type(child) is nn.Linear:  # not attention's own out_proj (a subclass), handled above
                setattr(parent, name, int8_linear(child.weight, child.bias))
    return tower.eval()


class Int8TorchTowers:
    """Pooled towers with the int8 image tower; texts through the version's fp32 text towers."""

    def __init__(self, bundle: ModelBundle) -> None:
        if str(bundle.device) != "cpu":
            raise BackendError(f"torch int8 runs on the CPU (the version is on {bundle.device})")
        if not has_int8_engine():
            raise BackendError("this torch build has no quantised CPU engine (fbgemm, x86 or qnnpack)")
        self.bundle = bundle
        self.variants: Collection[str] = [v for v in bundle.text_models if v != bundle.default_text_encoder]
        # A shallow view of the model with the int8 tower in place of ``visual``: the version's own
        # model (fp32 text towers, dense features, YUKINO) is shared, not copied or changed.
        self.model = copy.copy(bundle.model)
        self.model._modules = {**bundle.model._modules, "visual": quantize_tower(bundle.model.visual)}
        self.quantised = sum(isinstance(m, DynamicInt8Linear) for m in self.model.visual.modules())
        if not self.quantised:
            raise BackendError(f"the image tower of {bundle.ref} has no linear layer to run in int8")

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        return encode_pixels(self.model, self.bundle.preprocess_config, images)[0].numpy()

    def encode_tokens(self, tokens: torch.Tensor | np.ndarray, variant: str | None = None) -> np.ndarray:
        return self.bundle.encode_tokens(torch.as_tensor(tokens), variant)
