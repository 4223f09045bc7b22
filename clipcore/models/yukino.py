"""YUKINO: an image as a pseudo-token in the text encoder's input space.

``Inverter`` is the distilled 3-layer MLP: the frozen image tower's class + patch tokens
(flattened) -> one token embedding ``v*``. The prompts "a photo of $" and "a photo of no $" are
encoded with ``v*`` in place of ``$`` by the chosen text-encoder variant, and
``clipcore.methods.yukino.yes_no_scores`` matches captions against them. ``YukinoHead`` is that
inverter with its prompts and config, as stored in a model version (``yukino.safetensors`` +
``components["yukino"]``, read as ``Components.yukino``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from open_clip.model import CLIP
from safetensors.torch import load_file, save
from torch import nn

from clipcore.models.clip_model import normalize, text_features, tokenizer_for
from clipcore.models.components import Components

PLACEHOLDER = "$"  # its own BPE token when it stands between spaces ("$." would merge)
YES_PROMPT = "a photo of $"
NO_PROMPT = "a photo of no $"


class Inverter(nn.Module):
    def __init__(self, in_dim: int, token_dim: int, width: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(in_dim),
            nn.Linear(in_dim, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, token_dim),
        )

    def forward(self, image_tokens: torch.Tensor) -> torch.Tensor:
        """``(B, 1+P, D)`` normalised class + patch tokens -> ``(B, W)`` pseudo-token embeddings."""
        return self.net(image_tokens.flatten(1))


def prompt_tokens(context_length: int) -> tuple[torch.Tensor, int]:
    """Token ids of the yes and no prompts ``(2, L)`` and the placeholder's id."""
    tok = tokenizer_for(context_length)
    (placeholder,) = tok.encode(PLACEHOLDER)
    rows = [[tok.sot_token_id, *tok.encode(p), tok.eot_token_id] for p in (YES_PROMPT, NO_PROMPT)]
    width = max(map(len, rows))
    out = torch.zeros(2, width, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out, placeholder


def prompt_features(text_model: CLIP, pseudo: torch.Tensor, context_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, W)`` pseudo-tokens -> normalised yes and no prompt features, each ``(B, D)``
    (differentiable in ``pseudo``)."""
    tokens, placeholder = prompt_tokens(context_length)
    tokens = tokens.to(pseudo.device)
    b = pseudo.shape[0]
    batch = torch.cat([tokens[:1].expand(b, -1), tokens[1:].expand(b, -1)])
    feats = normalize(text_features(text_model, batch, pseudo=(placeholder, pseudo.repeat(2, 1)))[0].float())
    return feats[:b], feats[b:]


@dataclass
class YukinoHead:
    inverter: Inverter
    text_encoder: str  # the text-encoder variant the inverter was trained with
    config: dict[str, Any]

    FILE = "yukino.safetensors"

    def to_files(self) -> tuple[dict[str, bytes], dict[str, Any]]:
        """Files and the manifest component for a published version."""
        # fp16 on disk like the model weights (the version is evaluated after this round trip).
        state = {k: v.detach().cpu().half().contiguous() for k, v in self.inverter.state_dict().items()}
        return {self.FILE: save(state)}, {"file": self.FILE, "text_encoder": self.text_encoder, "config": self.config}

    @classmethod
    def from_components(cls, directory: Path, components: Components, device: str = "cpu") -> YukinoHead | None:
        """The head of a model version (``components.yukino``), or None if it has none."""
        spec = components.yukino
        if spec is None:
            return None
        cfg = dict(spec.config)
        inverter = Inverter(cfg["in_dim"], cfg["token_dim"], cfg.get("width", 512))
        inverter.load_state_dict({k: v.float() for k, v in load_file(str(directory / spec.file)).items()})
        return cls(inverter.to(device).eval(), spec.text_encoder, cfg)
