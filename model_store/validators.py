"""Version validators that installed packages register, found without importing them here.

The store stands alone (it imports no model code), yet ``publish``, ``promote`` and ``verify`` on
the command line should refuse a version whose model cannot load. Packages that know how to load
a model register a ``VersionValidator`` under the entry-point group ``model_store.validators``
(this project registers ``clipcore.models.validate:validate_version``); the command line loads
them on first use, so commands that never validate (``list``, ``show``) stay fast.
"""

from __future__ import annotations

import hashlib
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec
from pathlib import Path

from model_store.integrity import VersionValidator
from model_store.manifest import Manifest

ENTRY_POINT_GROUP = "model_store.validators"


def installed_validator_names() -> list[str]:
    """``name = module:function`` of every registered validator."""
    return sorted(f"{ep.name} = {ep.value}" for ep in entry_points(group=ENTRY_POINT_GROUP))


def _identity(ep: EntryPoint) -> str:
    """``name = module:function (package version, module sha256 prefix)``: what a load-check receipt
    names, so that another release or an edited validator module checks again. Found without
    importing the module (only its parent packages)."""
    package = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown package"
    try:
        spec = find_spec(ep.module)
        source = Path(spec.origin).read_bytes() if spec is not None and spec.origin else b""
    except (ImportError, OSError, ValueError):
        source = b""
    digest = hashlib.sha256(source).hexdigest()[:16] if source else "unknown"
    return f"{ep.name} = {ep.value} ({package}, module sha256 {digest})"


class InstalledValidators:
    """Every registered validator, loaded on first call, run in name order."""

    def identity(self) -> list[str]:
        """Which validators would run, at which versions (``model_store.load_receipts``)."""
        return [_identity(ep) for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)]

    def __init__(self) -> None:
        self._loaded: list[VersionValidator] | None = None

    def __call__(self, manifest: Manifest, directory: Path) -> None:
        if self._loaded is None:
            found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
            self._loaded = [ep.load() for ep in found]
        for validator in self._loaded:
            validator(manifest, directory)
