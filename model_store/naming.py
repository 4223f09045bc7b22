"""Name validation, reference parsing and version ordering.

Every model, version and alias name becomes a path segment (or an object key), so
names are checked against one strict pattern before any I/O: this is what keeps a
reference such as ``../etc`` from ever reaching the filesystem.
"""

from __future__ import annotations

import re

from model_store.backends.base import COMMIT_MARKER
from model_store.errors import InvalidName

# Starts with a letter or digit, so ".", "..", ".lock" and ".staging-*" can never be names.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_NAME_RE = re.compile(rf"^{NAME_PATTERN}$")
_AUTO_VERSION_RE = re.compile(r"^v(\d+)$")
_CHUNK_RE = re.compile(r"(\d+)")

DEFAULT_ALIAS = "production"
MANIFEST_FILE = COMMIT_MARKER  # written last: the backends make a version visible by it


def validate_name(value: str, kind: str = "name") -> str:
    """Return ``value`` if it is a safe model/version/alias name, else raise ``InvalidName``."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise InvalidName(f"invalid {kind} {value!r}: use letters, digits and '._-', starting alphanumeric")
    return value


def is_valid_name(value: str) -> bool:
    """Whether ``value`` is a valid name (used to skip foreign entries when listing)."""
    return bool(_NAME_RE.fullmatch(value))


def validate_filename(value: str) -> str:
    """Validate a relative file path inside a version (``model.safetensors``, ``onnx/visual.onnx``).

    Each ``/``-separated segment must be a valid name, which rules out absolute
    paths, ``..``, hidden files and backslashes.
    """
    if not isinstance(value, str) or not value:
        raise InvalidName(f"invalid file name {value!r}")
    for segment in value.split("/"):
        if not _NAME_RE.fullmatch(segment):
            raise InvalidName(f"invalid file name {value!r}: bad segment {segment!r}")
    return value


def parse_ref(ref: str) -> tuple[str, str]:
    """Split ``name@selector`` into its parts; a bare ``name`` selects ``production``.

    The selector is later looked up as an alias first, then as a literal version.
    """
    name, sep, selector = ref.partition("@")
    if not sep:
        selector = DEFAULT_ALIAS
    return validate_name(name, "model name"), validate_name(selector, "alias or version")


def natural_key(version: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key that orders embedded integers numerically, so ``v2`` < ``v10``."""
    return tuple(
        (0, int(chunk), "") if chunk.isdigit() else (1, 0, chunk) for chunk in _CHUNK_RE.split(version) if chunk
    )


def sort_versions(versions: list[str]) -> list[str]:
    """Return versions oldest-first in natural order."""
    return sorted(versions, key=natural_key)


def next_version(existing: list[str]) -> str:
    """Next automatic version name: ``v<N+1>`` for the highest existing ``vN`` (``v1`` if none)."""
    numbers = [int(m.group(1)) for v in existing if (m := _AUTO_VERSION_RE.fullmatch(v))]
    return f"v{max(numbers, default=0) + 1}"
