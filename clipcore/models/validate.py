"""The load check every version passes before it is published or promoted (and on ``verify``).

The store only knows files and digests; this builds the model from the manifest alone, loads the
version's weights, runs one image and two texts through every text-encoder variant at the recorded
image size, and checks that the embeddings have the recorded width and are finite. A manifest that
would publish and then keep a server at 503 (a wrong ``embed_dim`` or ``image_size``, weights that
do not fit the architecture, a method the family cannot run) is refused with the reason instead.

Registered as the ``model_store.validators`` entry point ``clip`` (see pyproject.toml), so the
``model-store`` command line uses it without the store importing this package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.errors import ClipError
from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import architecture_config, config_image_size
from clipcore.models.components import Components, ComponentsInvalid
from clipcore.models.hf_tokenizer import BPE_TOKENIZER, hf_tokenizer_dir
from model_store import Manifest

SMOKE_TEXTS = ("a photo of a red circle", "a photo of a blue square")


class VersionInvalid(ValueError):
    """The version cannot serve as its manifest describes; the message says why."""


def smoke_image(size: int) -> np.ndarray:
    """One (1, size, size, 3) uint8 image with structure in it (a gradient and a square)."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    image = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (size, 1)), np.tile(ramp[:, None], (1, size))], -1)
    image[size // 4 : size // 2, size // 4 : size // 2] = (255, 0, 0)
    return image.astype(np.uint8)[None]


def check_manifest_architecture(manifest: Manifest) -> Components:
    """Checks that need no weights: the architecture exists and takes the recorded image size, and
    the components have the types their readers need (returned, parsed)."""
    try:
        config = architecture_config(manifest.architecture)
    except (KeyError, TypeError, ValueError) as exc:
        raise VersionInvalid(f"architecture: {exc}") from None
    hf_tokenizer = config.get("text_cfg", {}).get("hf_tokenizer_name")
    folder = hf_tokenizer_dir(manifest.tokenizer)
    if folder is None and manifest.tokenizer != BPE_TOKENIZER:
        raise VersionInvalid(
            f"unknown tokenizer {manifest.tokenizer!r}; known: {BPE_TOKENIZER!r} and 'hf:<folder in the version>'"
        )
    if hf_tokenizer and folder is None:
        raise VersionInvalid(
            f"the architecture tokenizes with the Hugging Face tokenizer {hf_tokenizer!r} but the version "
            f"holds no tokenizer (tokenizer is {manifest.tokenizer!r}); import it with its tokenizer folder "
            "(--tokenizer-dir, or inside --hf-dir)"
        )
    if folder is not None and not any(f.startswith(f"{folder}/") for f in manifest.files):
        raise VersionInvalid(f"tokenizer {manifest.tokenizer!r}: the version has no files under {folder}/")
    try:
        components = Components.from_manifest(manifest.components)
    except ComponentsInvalid as exc:
        raise VersionInvalid(str(exc)) from None
    if folder is not None and components.dense:
        raise VersionInvalid("per-token components (DCSM, YUKINO) read open_clip's BPE tokens, not this tokenizer's")
    size = config_image_size(config)
    if size != manifest.image_size:
        raise VersionInvalid(f"image_size is {manifest.image_size} but the architecture takes {size} px images")
    if int(config.get("embed_dim", manifest.embed_dim)) != manifest.embed_dim:
        raise VersionInvalid(f"embed_dim is {manifest.embed_dim} but the architecture embeds to {config['embed_dim']}")
    return components


@torch.no_grad()
def validate_version(manifest: Manifest, directory: Path) -> None:
    """Raise ``VersionInvalid`` naming what is wrong when the version in ``directory`` cannot serve."""
    components = check_manifest_architecture(manifest)
    if components.weights is None:
        raise VersionInvalid("components.weights is not set: the version holds no weights")
    try:
        bundle = ModelBundle.from_directory(manifest, directory)
    except ClipError as exc:
        raise VersionInvalid(exc.message) from None
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise VersionInvalid(f"the model does not load from its manifest and weights: {exc}") from None
    vocab = int(architecture_config(manifest.architecture).get("text_cfg", {}).get("vocab_size", 49408))
    if bundle.hf_tokenizer is not None and bundle.hf_tokenizer.vocab_size > vocab:
        raise VersionInvalid(
            f"the tokenizer has {bundle.hf_tokenizer.vocab_size} tokens but the text tower embeds {vocab}"
        )
    dense = components.dense
    if dense and not isinstance(bundle.model, CLIP):
        raise VersionInvalid(
            f"components {dense} need per-token features, which {type(bundle.model).__name__} models do not have"
        )
    try:
        image = bundle.encode_images(smoke_image(manifest.image_size))
        texts = {variant: bundle.encode_texts(SMOKE_TEXTS, variant) for variant in bundle.text_models}
    except (RuntimeError, ValueError, IndexError, ClipError) as exc:
        reason = exc.message if isinstance(exc, ClipError) else str(exc).splitlines()[0]
        raise VersionInvalid(f"the smoke forward pass failed at {manifest.image_size} px: {reason}") from None
    for what, features in [("image", image), *((f"text ({v})", t) for v, t in texts.items())]:
        if features.shape[-1] != manifest.embed_dim:
            raise VersionInvalid(
                f"embed_dim is {manifest.embed_dim} but the {what} embeddings are {features.shape[-1]} wide"
            )
        if not np.isfinite(features).all():
            raise VersionInvalid(f"the {what} embeddings are not finite")
