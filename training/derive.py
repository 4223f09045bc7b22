"""Publish a new version that keeps everything a base version has and adds (or replaces) parts.

Every method trained on a user's data starts from a store version (``name@alias``: an imported
pretrained CLIP, or an earlier result) and publishes a version with the same weights and
components plus its own: PC-CLIP adds a text encoder, DCSM a scorer, ``comparatives`` a library.
The base version's files are streamed from the store (verified first), so nothing is re-encoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from model_store import Manifest, ModelStore
from model_store.manifest import ANNEX_FILES

# Manifest fields a derived version takes over from its base unchanged.
_INHERITED = ("architecture", "hooks", "tokenizer", "context_length", "embed_dim", "image_size", "preprocess")


def publish_derived(
    store: ModelStore,
    base_ref: str,
    *,
    name: str | None = None,
    files: Mapping[str, bytes] = {},
    components: Mapping[str, Any] = {},
    text_encoders: Mapping[str, str] = {},
    metrics: Mapping[str, float] = {},
    training: Mapping[str, Any] = {},
    data: Mapping[str, Any] = {},
    notes: str = "",
    aliases: Sequence[str] = (),
) -> Manifest:
    """A new version of ``name`` (default: the base's name) = the base's files and components,
    with ``files`` added or replaced, ``components`` merged in and ``text_encoders`` added to the
    base's text encoders. Metrics start from the base's and are updated by ``metrics``."""
    base_name, base_version = store.resolve(base_ref)
    base, directory = store.load_verified(base_name, base_version)
    sources: dict[str, Any] = {filename: directory / filename for filename in base.files if filename not in ANNEX_FILES}
    sources.update(files)
    merged = dict(base.components)
    merged.update(components)
    if text_encoders:
        merged["text_encoders"] = {**base.components.get("text_encoders", {}), **text_encoders}
    fields = {key: getattr(base, key) for key in _INHERITED}
    fields |= {
        "components": merged,
        "metrics": {**base.metrics, **metrics},
        "training": {"base": f"{base_name}@{base_version}", **training},
        "data": {**base.data, **data},
        "notes": notes or f"derived from {base_name}@{base_version}",
    }
    return store.publish(name or base_name, sources, fields, aliases=aliases)
