"""Batched, normalised encoding of images and texts for training and evaluation.

Images go through ``clipcore.models.encoding.encode_pixels``, the path serving uses, with the
version's ``PreprocessConfig`` (its manifest's mean and std; a model trained from scratch uses the
configuration it will be published with). Texts are tokenized as the version says: open_clip's BPE,
or the version's Hugging Face tokenizer (``Tokenize.for_bundle``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import embed_width, normalize, text_features, tokenizer_for, trimmed
from clipcore.models.encoding import encode_pixels
from clipcore.models.preprocess import PreprocessConfig
from training.distributed import map_sharded


class Tokenize:
    """Caching tokenizer: captions repeat a lot in the shapes world and in a user's labels."""

    def __init__(self, context_length: int, tokenizer: Callable[[Sequence[str]], torch.Tensor] | None = None) -> None:
        # open_clip's BPE rows (full context, cut to the batch's longest text), or another tokenizer's
        # rows as it gives them (a Hugging Face tokenizer pads to the full context with its own ids).
        self.tokenizer = tokenizer or tokenizer_for(context_length)
        self.trim = tokenizer is None
        self.cache: dict[str, torch.Tensor] = {}

    @classmethod
    def for_bundle(cls, bundle: ModelBundle) -> Tokenize:
        """The version's own tokenizer, as serving tokenizes (``ModelBundle.tokenize``)."""
        hf = bundle.hf_tokenizer
        return cls(bundle.context_length, None if hf is None else hf.tokenize)

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            for t, row in zip(missing, self.tokenizer(missing)):
                self.cache[t] = row
        rows = torch.stack([self.cache[t] for t in texts])
        return trimmed(rows) if self.trim else rows


def encode_images(
    model: CLIP, preprocess: PreprocessConfig, images: np.ndarray, batch_size: int = 256, device: str = "cpu"
) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, D) L2-normalised float32 on CPU. Under torchrun each rank encodes
    its shard of the images and every rank gets all of them (``training.distributed``)."""
    model.eval()
    width = embed_width(model)  # an empty shard still has the embedding's width

    def encode(part: np.ndarray) -> torch.Tensor:
        out = [torch.zeros(0, width)]
        for i in range(0, len(part), batch_size):
            out.append(encode_pixels(model, preprocess, part[i : i + batch_size], device=device)[0].cpu())
        return torch.cat(out)

    return map_sharded(encode, images)


def encode_image_tokens(
    model: CLIP, preprocess: PreprocessConfig, images: np.ndarray, batch_size: int = 256, device: str = "cpu"
) -> torch.Tensor:
    """(N, S, S, 3) uint8 -> (N, 1+P, D) normalised class + patch tokens, float32 on CPU."""
    out = []
    for i in range(0, len(images), batch_size):
        _, tokens = encode_pixels(model, preprocess, images[i : i + batch_size], device=device, dense=True)
        if tokens is None:
            raise ValueError("this image tower gives no patch tokens")
        out.append(tokens.cpu())
    return torch.cat(out)


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
