"""Building open_clip CLIP models from JSON configs, and their pooled and dense features.

The same functions serve training, evaluation and the service, so a model is encoded the
same way everywhere. Configs follow open_clip's ``model_configs/*.json`` layout; a config may
name registered ``hooks`` (small architecture changes a recipe needs) with their options.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from torch import nn

from clipcore.models.tokenizer import BoundedTokenizer

# Parameter-name prefixes of the text tower of an open_clip CLIP (everything else is the image
# tower or the logit scale/bias).
TEXT_TOWER_PREFIXES = ("token_embedding", "positional_embedding", "transformer.", "ln_final", "text_projection")


def is_text_param(name: str) -> bool:
    return name.startswith(TEXT_TOWER_PREFIXES)


ModelHook = Callable[[CLIP, dict[str, Any]], None]
MODEL_HOOKS: dict[str, ModelHook] = {}


def register_hook(name: str) -> Callable[[ModelHook], ModelHook]:
    def wrap(fn: ModelHook) -> ModelHook:
        MODEL_HOOKS[name] = fn
        return fn

    return wrap


class ConvStem(nn.Module):
    """Stride-8 conv stem with BatchNorm, a drop-in for the ViT patch embedding.

    With the stock linear patch embedding a from-scratch model on tiny images stays at
    chance on shape for a long time; a conv stem gives the image tower local edge
    features from the first step.
    """

    def __init__(self, width: int, channels: tuple[int, int] = (32, 64)) -> None:
        super().__init__()
        c1, c2 = channels
        self.net = nn.Sequential(
            nn.Conv2d(3, c1, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(c1),
            nn.GELU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(c2),
            nn.GELU(),
            nn.Conv2d(c2, width, 3, stride=2, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_hook("conv_stem")
def _conv_stem(model: CLIP, options: dict[str, Any]) -> None:
    visual = model.visual
    if visual.conv1.stride != (8, 8):
        raise ValueError("conv_stem replaces a patch-8 embedding only")
    width = visual.conv1.out_channels
    visual.conv1 = ConvStem(width, tuple(options.get("channels", (32, 64))))  # type: ignore[arg-type]


def build_model(config: dict[str, Any]) -> CLIP:
    """A randomly initialised CLIP from an open_clip-style config plus its hooks."""
    cfg = dict(config)
    hooks: list[str] = list(cfg.pop("hooks", []))
    hook_options: dict[str, dict[str, Any]] = cfg.pop("hook_options", {})
    model = CLIP(**cfg)
    for name in hooks:
        if name not in MODEL_HOOKS:
            raise KeyError(f"unknown model hook {name!r}; known: {sorted(MODEL_HOOKS)}")
        MODEL_HOOKS[name](model, hook_options.get(name, {}))
    return model


def load_architecture(architecture: dict[str, Any], device: str = "cpu", pretrained: bool = True) -> CLIP:
    """Model from a manifest's architecture: an inline config or an open_clip name (+ weights).

    ``pretrained`` loads an open_clip pretrained tag or local checkpoint when the
    architecture names one; without it the weights are random.
    """
    if "open_clip_name" in architecture:
        model = open_clip.create_model(
            architecture["open_clip_name"],
            pretrained=architecture.get("pretrained") if pretrained else None,
            device=device,
        )
        return model  # type: ignore[return-value]
    return build_model(architecture).to(device)


@functools.lru_cache(maxsize=8)
def tokenizer_for(context_length: int) -> BoundedTokenizer:
    """The standard open_clip BPE tokenizer with bounded work and memory per text (cached:
    building it reads the vocabulary)."""
    return BoundedTokenizer(context_length=context_length)


def trimmed(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens cut after the longest sequence's end token: the causal mask makes the cut exact."""
    length = int(tokens.argmax(dim=-1).max().item()) + 1
    return tokens[:, :length]


def text_features(
    model: CLIP, tokens: torch.Tensor, dense: bool = False, pseudo: tuple[int, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Projected pooled text features (B, D) and, if ``dense``, every position's (B, L, D).

    Tokens may be trimmed (see ``trimmed``); outputs equal the full-length computation.
    ``pseudo = (token_id, vectors)`` puts row ``b`` of the ``(B, W)`` vectors in place of the
    token embedding wherever ``tokens[b]`` holds ``token_id`` (YUKINO's pseudo-tokens; gradients
    flow into the vectors). Features are not normalised.
    """
    length = tokens.shape[1]
    cast = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens)
    if pseudo is not None:
        token_id, vectors = pseudo
        x = torch.where((tokens == token_id)[..., None], vectors[:, None, :].to(x.dtype), x)
    x = x.to(cast) + model.positional_embedding[:length].to(cast)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    x = model.ln_final(x)
    proj = model.text_projection
    pooled = x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]
    pooled = proj(pooled) if isinstance(proj, nn.Linear) else pooled @ proj
    if not dense:
        return pooled, None
    tok = proj(x) if isinstance(proj, nn.Linear) else x @ proj
    return pooled, tok


def image_features(model: CLIP, images: torch.Tensor, dense: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Projected pooled image features (B, D) and, if ``dense``, every token's (B, 1 + P, D).

    Dense tokens are the class token followed by the patch tokens, through ``ln_post`` and
    the projection. Features are not normalised.
    """
    visual = model.visual
    if not dense or not hasattr(visual, "forward_intermediates"):
        return visual(images), None
    # open_clip's public intermediates of the last block, through ln_post: class token + patches.
    out = visual.forward_intermediates(
        images, indices=1, normalize_intermediates=True, intermediates_only=True, output_fmt="NLC",
        output_extra_tokens=True,
    )  # fmt: skip
    x = torch.cat([out["image_intermediates_prefix"][-1], out["image_intermediates"][-1]], dim=1)
    tokens = x @ visual.proj if visual.proj is not None else x
    return tokens[:, 0], tokens


def normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)
