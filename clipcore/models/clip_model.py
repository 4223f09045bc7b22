"""Building open_clip models from JSON configs, and their pooled and dense features.

The same functions serve training, evaluation and the service, so a model is encoded the
same way everywhere. Configs follow open_clip's ``model_configs/*.json`` layout; a config may
name registered ``hooks`` (small architecture changes a recipe needs) with their options.

Families: ``CLIP`` (text tower at the top level), ``CustomTextCLIP`` (text tower under ``text.``:
SigLIP, MobileCLIP, PE-Core, HF text towers) and ``CoCa`` (its contrastive head is served; the
captioning decoder is not). Every family gives pooled features; per-token text features (DCSM,
YUKINO's pseudo-tokens) exist for the ``CLIP`` family only, and asking another family for them
raises ``ClipError(unsupported_for_family)`` (a 400 in the API), never a crash.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from open_clip.coca_model import CoCa
from open_clip.model import CLIP, CustomTextCLIP
from torch import nn

from clipcore.errors import ClipError, ErrorCode
from clipcore.models.tokenizer import BoundedTokenizer

# Parameter-name prefixes of the text tower: top-level in a CLIP, under ``text.`` in a
# CustomTextCLIP or CoCa (everything else is the image tower, the logit scale/bias or CoCa's
# captioning decoder).
TEXT_TOWER_PREFIXES = (
    "token_embedding",
    "positional_embedding",
    "transformer.",
    "ln_final",
    "text_projection",
    "text.",
)
# The token-embedding table stays shared with the base in text finetunes (a variant's file stays small).
TOKEN_TABLE_PREFIXES = ("token_embedding", "text.token_embedding")


def is_text_param(name: str) -> bool:
    return name.startswith(TEXT_TOWER_PREFIXES)


def is_trainable_text_param(name: str) -> bool:
    """What the text-tower finetunes (PC-CLIP, SemCLIP, YUKINO's encoder) train, in any family."""
    return is_text_param(name) and not name.startswith(TOKEN_TABLE_PREFIXES)


def family(model: nn.Module) -> str:
    """``clip``, ``custom_text`` or ``coca``: which open_clip class the model is."""
    if isinstance(model, CoCa):
        return "coca"
    return "custom_text" if isinstance(model, CustomTextCLIP) else "clip"


def unsupported(model: nn.Module, what: str) -> ClipError:
    return ClipError(
        ErrorCode.unsupported_for_family,
        f"{what} needs per-token text features, which only the CLIP family provides; this model is "
        f"{type(model).__name__}",
    )


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


def model_class(config: dict[str, Any]) -> type[nn.Module]:
    """The open_clip class a config builds, chosen as ``open_clip.create_model`` chooses it."""
    if config.get("custom_text") or "hf_model_name" in config.get("text_cfg", {}):
        return CoCa if "multimodal_cfg" in config else CustomTextCLIP
    return CLIP


def build_model(config: dict[str, Any]) -> CLIP:
    """A randomly initialised model from an open_clip-style config plus its hooks.

    Built directly from the class rather than through ``open_clip.create_model``: nothing is ever
    downloaded (timm and HF towers start empty too) and nothing logs "initialized randomly" for a
    model whose weights are loaded right after. ``CustomTextCLIP`` and ``CoCa`` share the methods
    callers use (``encode_image``/``encode_text``, ``visual``, ``logit_scale``); the text internals
    are reached through the functions below, which check the family.
    """
    cfg = dict(config)
    hooks: list[str] = list(cfg.pop("hooks", []))
    hook_options: dict[str, dict[str, Any]] = cfg.pop("hook_options", {})
    cls = model_class(cfg)
    cfg.pop("custom_text", None)
    cfg.pop("preprocess_cfg", None)
    if "hf_model_name" in cfg.get("text_cfg", {}):
        cfg["text_cfg"] = {**cfg["text_cfg"], "hf_model_pretrained": False}
    if "timm_model_name" in cfg.get("vision_cfg", {}):
        cfg["vision_cfg"] = {**cfg["vision_cfg"], "timm_model_pretrained": False}
    model = cls(**cfg)
    for name in hooks:
        if name not in MODEL_HOOKS:
            raise KeyError(f"unknown model hook {name!r}; known: {sorted(MODEL_HOOKS)}")
        MODEL_HOOKS[name](model, hook_options.get(name, {}))  # type: ignore[arg-type]
    return model  # type: ignore[return-value]


def architecture_config(architecture: dict[str, Any]) -> dict[str, Any]:
    """The open_clip model config of a manifest's architecture: an inline config, or an open_clip
    model name (``{"open_clip_name": "ViT-B-32"}``, optionally with top-level overrides) looked up
    in open_clip's bundled configs."""
    if "open_clip_name" in architecture:
        name = str(architecture["open_clip_name"])
        if ":" in name:  # hf-hub: / local-dir: names would fetch or read outside the version
            raise ValueError(f"open_clip_name {name!r}: a bundled config name only (import hub folders with --hf-dir)")
        config = open_clip.get_model_config(name)
        if config is None:
            raise ValueError(f"open_clip has no model config named {name!r}")
        # Other top-level keys override the named config (e.g. ``quick_gelu`` for OpenAI's weights).
        overrides = {k: v for k, v in architecture.items() if k not in ("open_clip_name", "pretrained")}
        return {**config, **overrides}
    return dict(architecture)


def config_image_size(config: dict[str, Any]) -> int:
    """The square input size in pixels of an open_clip config (224 when the config leaves it out)."""
    size = config.get("vision_cfg", {}).get("image_size", 224)
    if isinstance(size, list | tuple):
        if len(set(size)) != 1:
            raise ValueError(f"non-square image size {list(size)} is not supported")
        size = size[0]
    return int(size)


def load_architecture(architecture: dict[str, Any], device: str = "cpu") -> CLIP:
    """A randomly initialised model of a manifest's architecture: its weights always come from the
    version's own files (the store refuses a manifest that points at weights outside it)."""
    return build_model(architecture_config(architecture)).to(device)


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

    Other families than CLIP get pooled features only, from their own ``encode_text`` on tokens
    padded back to the full context (their towers may attend without a causal mask or pool the
    last position, so a trimmed batch would change the result).
    """
    if not isinstance(model, CLIP):
        if dense:
            raise unsupported(model, "dense text features (DCSM)")
        if pseudo is not None:
            raise unsupported(model, "pseudo-token text features (YUKINO)")
        context = int(getattr(model, "context_length", 0) or tokens.shape[1])
        if tokens.shape[1] < context:
            tokens = F.pad(tokens, (0, context - tokens.shape[1]))
        return model.encode_text(tokens, normalize=False), None
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
    """Projected pooled image features (B, D) and, if ``dense``, every token's (B, 1 + P, D),
    both from one forward pass (the pooled features are ``encode_image``'s either way).

    Dense tokens are the class token followed by the patch tokens, through ``ln_post`` and
    the projection. Features are not normalised.
    """
    visual = model.visual
    if not dense:
        return model.encode_image(images, normalize=False), None
    if not isinstance(model, CLIP) or not hasattr(visual, "forward_intermediates"):
        raise ClipError(
            ErrorCode.unsupported_for_family,
            f"per-patch image features need a CLIP vision transformer; this model is {type(model).__name__} "
            f"with a {type(visual).__name__} image tower",
        )
    # open_clip's public intermediates of the last block, through ln_post: class token + patches;
    # and, from the same pass, the tower's own pooled output (``encode_image``'s, whatever its
    # pooling), so one forward pass gives both what /embed returns and DCSM's tokens.
    out = visual.forward_intermediates(
        images, indices=1, normalize_intermediates=True, intermediates_only=False, output_fmt="NLC",
        output_extra_tokens=True,
    )  # fmt: skip
    x = torch.cat([out["image_intermediates_prefix"][-1], out["image_intermediates"][-1]], dim=1)
    tokens = x @ visual.proj if visual.proj is not None else x
    return out["image_features"], tokens


@torch.no_grad()
def embed_width(model: nn.Module) -> int:
    """Width of the joint embedding space (CLIP: the text projection's; other families: measured)."""
    if isinstance(model, CLIP):
        return int(model.text_projection.shape[1])
    device = next(model.parameters()).device
    tokens = torch.zeros(1, int(getattr(model, "context_length", 77)), dtype=torch.long, device=device)
    return int(model.encode_text(tokens, normalize=False).shape[-1])  # type: ignore[operator]


def normalize(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)
