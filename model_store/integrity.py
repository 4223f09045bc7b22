"""What a manifest must satisfy beyond its schema for its version to be self-contained.

A version is a closed set of files: every weight it loads is listed in ``files`` (so it is copied
into the version and checksummed). A manifest that loads weights from elsewhere (an open_clip
``pretrained`` tag that downloads at load time, an absolute checkpoint path) or whose components
name a file it does not list would publish and verify, then fail or drift when a server loads it;
these checks refuse it at publish, verify and promote instead. Whether the model then builds and
runs is a deeper check, injected into the store as a ``VersionValidator`` (see ``validators``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from model_store.errors import InvalidName
from model_store.manifest import Manifest
from model_store.naming import validate_filename

# Component values with these endings name files the loader opens.
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".onnx", ".npy", ".npz")


class VersionValidator(Protocol):
    """Raises (any exception; its message is the reason) when the version in ``directory`` cannot
    serve as its manifest describes. Called on the staged files before publish commits, and on the
    published files before an alias moves to them."""

    def __call__(self, manifest: Manifest, directory: Path) -> None: ...


def _file_refs(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        if value.endswith(WEIGHT_SUFFIXES):
            yield where, value
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _file_refs(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _file_refs(inner, f"{where}[{i}]")


def manifest_problems(manifest: Manifest) -> dict[str, str]:
    """Map each manifest field that makes the version depend on files outside it to the reason."""
    problems: dict[str, str] = {}
    pretrained = manifest.architecture.get("pretrained")
    if pretrained:
        problems["architecture.pretrained"] = (
            f"{pretrained!r} loads weights from outside the store (a download tag or a local path); "
            "import the weights into the version instead"
        )
    for where, filename in _file_refs(manifest.components, "components"):
        try:
            validate_filename(filename)
        except InvalidName:
            problems[where] = f"{filename!r} is outside the version"
            continue
        if filename not in manifest.files:
            problems[where] = f"{filename!r} is not among the version's files"
    return problems
