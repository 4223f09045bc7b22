"""Batched, normalised encoding of rendered images and texts for training and evaluation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.clip_model import embed_width, image_features, normalize, text_features, tokenizer_for, trimmed
from clipcore.models.preprocess import normalize_uint8
from training.distributed import map_sharded


class Tokenize:
    """Caching tokenizer: captions repeat a lot in the shapes world."""

    def __init__(self, context_length: int) -> None:
        self.tokenizer = tokenizer_for(context_length)
        self.cache: dict[str, torch.Tensor] = {}

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            for t, row in zip(missing, self.tokenizer(missing)):
                self.cache[t] = row
        return trimmed(torch.stack([self.cache[t] for t in texts]))


@torch.no_grad()
def encode_images(model: CLIP, images: np.ndarray, batch_size: int = 256, device: str = "cpu") -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, D) L2-normalised float32 on CPU. Under torchrun each rank encodes
    its shard of the images and every rank gets all of them (``training.distributed``)."""
    model.eval()
    width = embed_width(model)  # an empty shard still has the embedding's width

    def encode(part: np.ndarray) -> torch.Tensor:
        out = [torch.zeros(0, width)]
        for i in range(0, len(part), batch_size):
            x = normalize_uint8(part[i : i + batch_size]).to(device)
            out.append(normalize(image_features(model, x)[0]).float().cpu())
        return torch.cat(out)

    return map_sharded(encode, images)


@torch.no_grad()
def encode_texts(
    model: CLIP, tokenize: Tokenize, texts: Sequence[str], batch_size: int = 512, device: str = "cpu"
) -> torch.Tensor:
    """Texts -> (N, D) L2-normalised float32 on CPU."""
    model.eval()
    out = []
    for i in range(0, len(texts), batch_size):
        tokens = tokenize(texts[i : i + batch_size]).to(device)
        out.append(normalize(text_features(model, tokens)[0]).float().cpu())
    return torch.cat(out)
