"""``ModelStore.copy``: publish a byte copy of a version under a new version (or model) name.

What a rehearsal needs: a candidate that is the production model (same files, same configuration)
but another version, to walk a canary, a promote and a rollback through a live fleet without
training anything. ``publish`` of the version's folder with its own manifest refuses (the
manifest names the source's version); the copy takes every manifest field but the name, version
and creation time, writes the same files (checksummed again as any publish does), and carries the
annex files (``eval.json``, ``report.html``) over unchanged. The evaluation stays valid for the
copy: it is bound to the files and configuration, not to the version's name
(``model_store.evaluation``), so the gate compares the copy with its source like any candidate.
No alias moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from model_store.errors import StoreError
from model_store.naming import validate_name
from model_store.staging import FileSource

if TYPE_CHECKING:
    from model_store.manifest import Manifest
    from model_store.store import ModelStore

# Fields that describe the copy itself, not the model it holds.
_OWN_FIELDS = frozenset({"name", "version", "created_at", "files", "schema_version"})


def parse_target(target: str) -> tuple[str, str | None]:
    """``NAME@VERSION`` or ``NAME`` (the next free ``vN``)."""
    name, sep, version = target.partition("@")
    validate_name(name, "model name")
    if sep and not version:
        raise StoreError(f"--as takes NAME or NAME@VERSION, got {target!r}")
    if version:
        validate_name(version, "version")
    return name, version or None


def copy_version(
    store: ModelStore, name: str, version: str, to_name: str, to_version: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Manifest:  # fmt: skip
    """Publish ``name@version``'s files and annex files as ``to_name@to_version`` (next ``vN``
    when None), its manifest fields kept but for the copy's own; return the new manifest."""
    source = store.manifest(name, version)
    store.verify(name, version)  # a copy is only as sound as its source
    directory = store.version_dir(name, version)
    files: dict[str, FileSource] = {filename: directory / filename for filename in source.files}
    for annex in store.annex_files(name, version):
        raw = store.read_annex(name, version, annex)
        if raw is not None:  # read, not copied from a local path: on S3 the cache holds weights only
            files[annex] = raw
    fields = source.model_dump(mode="json", exclude=set(_OWN_FIELDS))
    fields["notes"] = f"copy of {source.ref}" + (f"; {source.notes}" if source.notes else "")
    return store.publish(to_name, files, fields, version=to_version, on_step=on_step)
