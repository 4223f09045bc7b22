"""The manifest: one declarative, checksummed description of a model version.

A loader must be able to build the model and its transforms from the manifest
alone (architecture, tokenizer, preprocessing, components), and to prove that the
blobs on disk are the ones that were published (``files`` digests). Unknown
top-level keys are rejected so a typo cannot silently drop information; the
free-form sections (``components``, ``training``, ``data``) stay open dicts because
their content evolves with the training code.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator

from model_store.naming import MANIFEST_FILE, validate_filename, validate_name

SCHEMA_VERSION = 1
# Files that may be added or replaced after publish; they are never checksummed.
ANNEX_FILES: frozenset[str] = frozenset({"eval.json", "report.html"})


def utc_now_iso() -> str:
    """Current time as an ISO-8601 UTC string with a ``Z`` suffix (second precision)."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class FileEntry(BaseModel):
    """Digest and size of one published file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class Manifest(BaseModel):
    """Immutable description of one model version (``<name>/versions/<version>/manifest.json``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    name: str
    version: str
    created_at: str = Field(default_factory=utc_now_iso)
    architecture: dict[str, Any]
    hooks: list[str] = Field(default_factory=list)
    tokenizer: str = "open_clip:bpe"
    context_length: int = Field(gt=0)
    embed_dim: int = Field(gt=0)
    image_size: int = Field(gt=0)
    preprocess: dict[str, Any]
    components: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileEntry] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict)  # NaN would break read-back checks
    notes: str = ""

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"unsupported manifest schema_version {value} (expected {SCHEMA_VERSION})")
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return validate_name(value, "model name")

    @field_validator("version")
    @classmethod
    def _valid_version(cls, value: str) -> str:
        return validate_name(value, "version")

    @field_validator("created_at")
    @classmethod
    def _iso_timestamp(cls, value: str) -> str:
        datetime.fromisoformat(value)  # raises ValueError on garbage
        return value

    @field_validator("files")
    @classmethod
    def _safe_files(cls, value: dict[str, FileEntry]) -> dict[str, FileEntry]:
        # A manifest read from disk must not be able to point outside its version dir.
        for filename in value:
            validate_filename(filename)
            if filename == MANIFEST_FILE or filename in ANNEX_FILES:
                raise ValueError(f"{filename!r} cannot be listed in files")
        return value

    @property
    def ref(self) -> str:
        """``name@version``, the cache-key-safe identity of this version."""
        return f"{self.name}@{self.version}"

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all listed files."""
        return sum(entry.bytes for entry in self.files.values())

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, indent 2, trailing newline) so digests of manifests are stable."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse and validate manifest JSON."""
        return cls.model_validate_json(text)

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read and validate a manifest file."""
        return cls.from_json(Path(path).read_bytes())

    def dump(self, path: str | Path) -> None:
        """Write canonical JSON to ``path`` (the store writes through its backend instead)."""
        Path(path).write_text(self.to_json(), encoding="utf-8")
