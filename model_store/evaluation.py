"""Which version an ``eval.json`` describes: the binding an evaluation writes into it, and its check.

``eval.json`` is an annex (``manifest.ANNEX_FILES``): it may be replaced after publish and is not
checksummed, so a report copied from another version would otherwise pass for this version's
evaluation. An evaluation therefore records what it evaluated, from the manifest of the version
it loaded, under ``"version"``::

    "version": {"ref": "default@v6",
                "files": {"model.safetensors": "<sha256>", ...},
                "config": "<sha256 of the model-defining manifest fields>"}

``files`` holds the digest of every checksummed file (the weights and everything else a loader
reads: text-encoder deltas, scorers, comparatives); ``config`` the digest of what builds the model
from them (architecture, hooks, tokenizer, sizes, preprocessing, components). A report is a
version's evaluation only when both match that version's manifest. The ref says where the
report was written (a version republished from the same files under another name is the same
model and keeps its evaluation); a report bound to other weights is no evaluation of this one.

Reports written before evaluations were bound carry no ``"version"``: one whose ``"model"``
names another version is a copy; any other is taken on its word, with a note saying so.

Pure: manifests and parsed reports in, verdicts out (the store reads the files).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from model_store.manifest import Manifest

EVAL_FILE = "eval.json"
BINDING_KEY = "version"
# The manifest fields that, with the files, make the model an evaluation measured.
CONFIG_FIELDS = frozenset(
    {"architecture", "hooks", "tokenizer", "context_length", "embed_dim", "image_size", "preprocess", "components"}
)


def config_digest(manifest: Manifest) -> str:
    """sha256 of the canonical JSON of the manifest's model-defining fields."""
    config = manifest.model_dump(mode="json", include=set(CONFIG_FIELDS))
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def binding(manifest: Manifest) -> dict[str, Any]:
    """What an evaluation of the version ``manifest`` describes records under ``"version"``."""
    return {
        "ref": manifest.ref,
        "files": {filename: entry.sha256 for filename, entry in sorted(manifest.files.items())},
        "config": config_digest(manifest),
    }


def bind(report: Mapping[str, Any], manifest: Manifest) -> dict[str, Any]:
    """``report`` as the evaluation of the version ``manifest`` describes (its ``model`` and binding set)."""
    return {**report, "model": manifest.ref, BINDING_KEY: binding(manifest)}


@dataclass(frozen=True)
class Provenance:
    """Whether a report is the evaluation of a version."""

    foreign: str | None = None  # why it is not (a copy, a broken binding); None: it is
    unbound: bool = False  # taken on its word: written before evaluations recorded a binding

    @property
    def belongs(self) -> bool:
        return self.foreign is None


def _short(ref: str, manifest: Manifest) -> str:
    """``v6`` for a version of the same model, else the whole ref."""
    name, _, version = ref.partition("@")
    return version if name == manifest.name and version else ref


def provenance(report: Mapping[str, Any], manifest: Manifest) -> Provenance:
    """Whether ``report`` (a parsed eval.json) is the evaluation of the version ``manifest`` describes."""
    what = f"the {EVAL_FILE} of {manifest.version}"
    bound = report.get(BINDING_KEY)
    if bound is None:
        model = report.get("model")
        if isinstance(model, str) and model != manifest.ref:
            return Provenance(foreign=f"{what} was written for {model}")
        return Provenance(unbound=True)
    files, config = (bound.get("files"), bound.get("config")) if isinstance(bound, Mapping) else (None, None)
    if not isinstance(files, Mapping) or not isinstance(config, str):
        return Provenance(foreign=f'{what} has an unreadable binding ("{BINDING_KEY}" needs "files" and "config")')
    ref = bound.get("ref")
    whose = f" ({_short(ref, manifest)}'s)" if isinstance(ref, str) and ref != manifest.ref else ""
    if dict(files) != {filename: entry.sha256 for filename, entry in manifest.files.items()}:
        return Provenance(foreign=f"{what} belongs to other weights{whose}")
    if config != config_digest(manifest):
        return Provenance(foreign=f"{what} belongs to another configuration of these weights{whose}")
    return Provenance()


def unbound_note(version: str) -> str:
    return (
        f"the {EVAL_FILE} of {version} records no weights (written before evaluations did): taken on its word; "
        f"`clip-train evaluate` binds it"
    )
