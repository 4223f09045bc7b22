"""Publish a new version that keeps everything a base version has and adds (or replaces) parts.

Every method trained on a user's data starts from a store version (``name@alias``: an imported
pretrained CLIP, or an earlier result) and publishes a version with the same weights and
components plus its own: PC-CLIP adds a text encoder, DCSM a scorer, ``comparatives`` a library.
The base version's files are streamed from the store (verified first), so nothing is re-encoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipcore.models.components import Components
from model_store import Manifest, ModelStore
from model_store.manifest import ANNEX_FILES

# Manifest fields a derived version takes over from its base unchanged.
_INHERITED = ("architecture", "hooks", "tokenizer", "context_length", "embed_dim", "image_size", "preprocess")


@dataclass
class DerivedParts:
    """What a method trained on a base version adds to it: files (added or replaced), manifest
    components merged into the base's, text encoders added to the base's, metrics updating the
    base's, and what the manifest records of the run."""

    files: Mapping[str, bytes | Path] = field(default_factory=dict)
    components: Mapping[str, Any] = field(default_factory=dict)
    text_encoders: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    training: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""


def publish_derived(
    store: ModelStore, base_ref: str, parts: DerivedParts, *, name: str | None = None, aliases: Sequence[str] = ()
) -> Manifest:
    """A new version of ``name`` (default: the base's name) = the base's files and components with
    ``parts`` added (see ``DerivedParts``)."""
    base_name, base_version = store.resolve(base_ref)
    base, directory = store.load_verified(base_name, base_version)
    sources: dict[str, Any] = {filename: directory / filename for filename in base.files if filename not in ANNEX_FILES}
    sources.update(parts.files)
    components = Components.from_manifest(base.components).merged(parts.components, parts.text_encoders)
    fields = {key: getattr(base, key) for key in _INHERITED}
    fields |= {
        "components": components.to_manifest(),
        "metrics": {**base.metrics, **parts.metrics},
        "training": {"base": f"{base_name}@{base_version}", **parts.training},
        "data": {**base.data, **parts.data},
        "notes": parts.notes or f"derived from {base_name}@{base_version}",
    }
    return store.publish(name or base_name, sources, fields, aliases=aliases)
