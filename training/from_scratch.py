"""What training a CLIP from scratch needs, whatever the data (the shapes world, a user's captions):
parameter groups, the text-tower freeze, and the image-text loss of one step.

The loss is the symmetric contrastive (InfoNCE) loss of pooled features plus, when ``filip`` is on,
a FILIP-style token-level term (``filip_weight``) that gives the dense features DCSM reads.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from open_clip.model import CLIP

from clipcore.methods.losses import clip_contrastive_loss, filip_loss
from clipcore.models.clip_model import image_features, is_text_param, text_features


def image_size(model_config: dict[str, Any]) -> int:
    """The square input size of a config's image tower (open_clip's default 224 when unset)."""
    size = model_config.get("vision_cfg", {}).get("image_size", 224)
    return int(size[0] if isinstance(size, list | tuple) else size)


def word_token_mask(tokens: torch.Tensor) -> torch.Tensor:
    """True at word tokens: after the start token, before the end token (the argmax)."""
    pos = torch.arange(tokens.shape[1], device=tokens.device)[None]
    return (pos > 0) & (pos < tokens.argmax(dim=-1, keepdim=True))


def param_groups(model: CLIP, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices (embeddings excepted), none on vectors and scalars."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        is_matrix = p.ndim >= 2 and "embedding" not in name
        (decay if is_matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def set_text_trainable(model: CLIP, trainable: bool) -> None:
    for name, p in model.named_parameters():
        if is_text_param(name):
            p.requires_grad_(trainable)


def image_text_loss(
    model: CLIP, images: torch.Tensor, tokens: torch.Tensor, *, filip_weight: float, filip: bool, dense: bool
) -> tuple[torch.Tensor, float, torch.Tensor | None, torch.Tensor | None]:
    """One step's loss on normalised ``images`` and their captions' ``tokens``: (loss, its contrastive
    term alone, image tokens, text tokens). ``dense``: compute per-token features (FILIP or another
    token-level term needs them)."""
    img_pooled, img_tok = image_features(model, images, dense=dense)
    txt_pooled, txt_tok = text_features(model, tokens, dense=dense)
    scale = model.logit_scale.exp().clamp(max=100)
    loss = clip_contrastive_loss(
        F.normalize(img_pooled.float(), dim=-1), F.normalize(txt_pooled.float(), dim=-1), scale
    )
    contrastive = loss.item()
    if filip and img_tok is not None and txt_tok is not None:
        loss = loss + filip_weight * filip_loss(img_tok.float(), txt_tok.float(), word_token_mask(tokens), scale)
    return loss, contrastive, img_tok, txt_tok
