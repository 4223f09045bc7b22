"""Only what the serving path needs stays resident: once a version's serving towers are chosen (and
gated against torch fp32), the torch towers that no batcher calls any more are freed.

ONNX Runtime serving a version encodes its pooled images and texts (every text-encoder variant) in
its own sessions, and DCSM's dense features in its dense graphs; the torch towers are then only
the parity gate's reference, already run. So with ONNX serving:

- the torch image tower is freed, unless the version has a YUKINO component: YUKINO inverts the
  torch image tower's patch tokens into a pseudo-token (``ModelBundle.yukino_prompts``), which no
  exported graph computes;
- every torch text tower is freed but YUKINO's own text encoder, through which that pseudo-token
  is read (``prompt_features`` runs the torch text transformer on embeddings, not token ids).

The model object itself stays (its logit scale and bias, a few floats, are read per request; its
type says which methods the family supports); a freed tower is replaced by ``ReleasedTower``,
which says why when it is called. torch backends (fp32, autocast, int8, CUDA graphs) keep every
tower: they compute with them (int8 shares the fp32 attention weights as its fallback). Training-
free methods read embeddings through the batchers, never the towers, so they need nothing more.
Freed memory is handed back to the system (``malloc_trim`` where glibc provides it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

import torch
from torch import nn

from clipcore.backends.base import ServingTowers

log = logging.getLogger(__name__)

# open_clip's text tower: CLIP keeps it in these attributes, CustomTextCLIP and CoCa in ``text``
# (CoCa's captioning decoder, ``text_decoder``, is no embedding path either).
TEXT_MODULES = ("transformer", "token_embedding", "ln_final", "text", "text_decoder")
TEXT_PARAMETERS = ("positional_embedding", "text_projection")


class ReleasedTower(nn.Module):
    """Stands where a freed torch tower was: calling it says what was freed and why."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__()
        self.what, self.why = what, why

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError(f"the torch {self.what} was freed ({self.why})")


def torch_needs(serving: ServingTowers) -> tuple[bool, set[str]]:
    """Whether the serving path still calls the torch image tower, and which text encoders' torch
    towers it calls (by name, the default one included)."""
    from clipcore.backends.onnx import OnnxTowers

    bundle = serving.bundle
    if not isinstance(serving.pooled, OnnxTowers):
        return True, set(bundle.text_models)
    if bundle.dcsm is not None and serving.dense is None:
        return True, set(bundle.text_models)  # DCSM's dense features from the torch towers
    if bundle.yukino is not None:
        return True, {bundle.yukino.text_encoder}
    return False, set()


def release_unserved(serving: ServingTowers) -> list[str]:
    """Free the torch towers the serving path no longer calls (``torch_needs``); what was freed."""
    bundle = serving.bundle
    image_needed, texts_needed = torch_needs(serving)
    why = f"ONNX Runtime serves {bundle.ref}"
    freed: list[str] = []
    models = {id(m): m for m in (bundle.model, *bundle.text_models.values())}
    if not image_needed:
        stub = ReleasedTower("image tower", why)
        for model in models.values():
            model.visual = stub
        freed.append("image tower")
    for name, model in bundle.text_models.items():
        if name in texts_needed:
            continue
        dropped = _release_text(model, ReleasedTower(f"text tower {name!r}", why))
        if dropped:
            freed.append(f"text tower {name!r}")
    if freed:
        gc.collect()
        trim_heap()
        log.info("freed the torch %s of %s (%s)", ", ".join(freed), bundle.ref, why)
    return freed


def _release_text(model: nn.Module, stub: ReleasedTower) -> bool:
    dropped = False
    for attr in TEXT_MODULES:
        if isinstance(getattr(model, attr, None), nn.Module):
            setattr(model, attr, stub)
            dropped = True
    for attr in TEXT_PARAMETERS:
        value = getattr(model, attr, None)
        if isinstance(value, nn.Parameter):
            setattr(model, attr, None)  # a registered parameter may be set to None
            dropped = True
        elif isinstance(value, nn.Module):
            setattr(model, attr, stub)
            dropped = True
    return dropped


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
