"""Version validators that installed packages register, found without importing them here.

The store stands alone (it imports no model code), yet ``publish``, ``promote`` and ``verify`` on
the command line should refuse a version whose model cannot load. Packages that know how to load
a model register a ``VersionValidator`` under the entry-point group ``model_store.validators``
(this project registers ``clipcore.models.validate:validate_version``); the command line loads
them on first use, so commands that never validate (``list``, ``show``) stay fast.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

from model_store.integrity import VersionValidator
from model_store.manifest import Manifest

ENTRY_POINT_GROUP = "model_store.validators"


def installed_validator_names() -> list[str]:
    """``name = module:function`` of every registered validator."""
    return sorted(f"{ep.name} = {ep.value}" for ep in entry_points(group=ENTRY_POINT_GROUP))


class InstalledValidators:
    """Every registered validator, loaded on first call, run in name order."""

    def __init__(self) -> None:
        self._loaded: list[VersionValidator] | None = None

    def __call__(self, manifest: Manifest, directory: Path) -> None:
        if self._loaded is None:
            found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
            self._loaded = [ep.load() for ep in found]
        for validator in self._loaded:
            validator(manifest, directory)
