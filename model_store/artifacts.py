"""Derived artifacts of a published version: files made from it elsewhere (exported graphs, a
measured decision) that every reader of one kind may reuse instead of making them again.

A version stays immutable: its artifacts live beside it, never inside its folder (a loader reads
the whole version folder, and on object storage a pod would then download every kind's files)::

    <name>/artifacts/<version>/<key>.json            # the set: what the writer recorded, files by sha256
    <name>/artifacts/<version>/<key>/<id>/<file>     # the files of one write of that set

``key`` is the writer's (a store knows nothing of what it means: ``clipcore.backends.shared``
keys by CPU kind, runtime versions and settings). A write uploads its files into a fresh
``<id>`` folder first and then replaces ``<key>.json`` in one step, so a reader sees the old set
or the new one whole, never a mix; the folders of earlier writes are removed afterwards (a
reader still copying one then finds its digest wrong and does without). Every file is checked
against its recorded sha256 when it is fetched. ``gc`` removes the artifacts of versions it
removes.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_store.digest import HashingReader
from model_store.errors import ChecksumMismatch, StoreError
from model_store.manifest import utc_now_iso
from model_store.naming import is_valid_name, validate_filename, validate_name

if TYPE_CHECKING:
    from model_store.backends import StorageBackend

ARTIFACTS_DIR = "artifacts"
RECORD_SUFFIX = ".json"


@dataclass(frozen=True)
class ArtifactSet:
    """One set of artifacts of ``name@version`` under ``key``: what its writer recorded
    (``meta``), its files (name -> sha256) in the folder ``folder``, and when it was written."""

    name: str
    version: str
    key: str
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    folder: str = ""
    written_at: str = ""


def artifacts_prefix(name: str, version: str) -> str:
    return f"{name}/{ARTIFACTS_DIR}/{version}"


class VersionArtifacts:
    """The artifact side of ``ModelStore`` (see the module's docstring)."""

    if TYPE_CHECKING:  # provided by ModelStore
        backend: StorageBackend

        def _require_version(self, name: str, version: str) -> None: ...

    def put_artifacts(
        self, name: str, version: str, key: str, files: Mapping[str, Path], meta: Mapping[str, Any]
    ) -> ArtifactSet:
        """Write (or replace) the set ``key`` of ``name@version``: ``files`` (name in the set ->
        local file) and ``meta`` (JSON-serialisable), visible to readers only once complete."""
        validate_name(key, "artifact key")
        for filename in files:
            validate_filename(filename)
        self._require_version(name, version)
        base = artifacts_prefix(name, version)
        folder = secrets.token_hex(8)
        digests: dict[str, str] = {}
        for filename, path in files.items():
            with path.open("rb") as source:
                reader = HashingReader(source)
                self.backend.put(f"{base}/{key}/{folder}/{filename}", reader)
            digests[filename] = reader.hexdigest()
        written = ArtifactSet(name, version, key, dict(meta), digests, folder, utc_now_iso())
        record = {
            "key": key,
            "meta": written.meta,
            "files": digests,
            "folder": folder,
            "written_at": written.written_at,
        }
        self.backend.put_atomic(f"{base}/{key}{RECORD_SUFFIX}", json.dumps(record, indent=2).encode())
        for old in self.backend.list_dir(f"{base}/{key}"):
            if old != folder:  # earlier writes of this set: no record names them any more
                self.backend.delete_tree(f"{base}/{key}/{old}")
        return written

    def artifacts(self, name: str, version: str, key: str) -> ArtifactSet | None:
        """The set ``key`` of ``name@version``, or None when none was written (one read)."""
        validate_name(key, "artifact key")
        validate_name(name, "model name")
        validate_name(version, "version")
        try:
            raw = self.backend.read_bytes(f"{artifacts_prefix(name, version)}/{key}{RECORD_SUFFIX}")
        except FileNotFoundError:
            return None
        try:
            record = json.loads(raw)
            files = {str(k): str(v) for k, v in dict(record.get("files", {})).items()}
            for filename in files:
                validate_filename(filename)
            folder = validate_name(str(record["folder"]), "artifact folder")
            return ArtifactSet(name, version, key, dict(record.get("meta", {})), files, folder,
                               str(record.get("written_at", "")))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError, StoreError) as exc:
            raise StoreError(f"artifact set {key!r} of {name}@{version} is unreadable: {exc}") from None

    def artifact_keys(self, name: str, version: str) -> list[str]:
        """Keys of the sets written for ``name@version`` (a listing)."""
        validate_name(name, "model name")
        validate_name(version, "version")
        entries = self.backend.list_dir(artifacts_prefix(name, version))
        keys = (e[: -len(RECORD_SUFFIX)] for e in entries if e.endswith(RECORD_SUFFIX))
        return sorted(k for k in keys if is_valid_name(k))

    def fetch_artifact(self, artifact_set: ArtifactSet, filename: str, dest: Path) -> Path:
        """Copy one file of ``artifact_set`` to ``dest`` (replaced in one step), checked against its
        recorded sha256: ``ChecksumMismatch`` when it differs (a newer write replaced the set meanwhile,
        or the blob was damaged) and nothing is left at ``dest``. A hard link where the store's
        local copy allows it (object storage: the node's blob cache), else a copy."""
        s = artifact_set
        if filename not in s.files:
            raise StoreError(f"artifact set {s.key!r} of {s.name}@{s.version} has no file {filename!r}")
        key = f"{artifacts_prefix(s.name, s.version)}/{s.key}/{s.folder}/{filename}"
        try:
            source = self.backend.local_path(key)
            dest.parent.mkdir(parents=True, exist_ok=True)
            temp = dest.with_name(f".{dest.name}.tmp-{secrets.token_hex(6)}")
            try:
                os.link(source, temp)
            except OSError:  # another filesystem, or links not allowed: a copy
                shutil.copyfile(source, temp)
        except FileNotFoundError:
            raise ChecksumMismatch(s.name, s.version, {f"artifacts {s.key}/{filename}": "missing"}) from None
        if _sha256_file(temp) != s.files[filename]:
            temp.unlink(missing_ok=True)
            raise ChecksumMismatch(s.name, s.version, {f"artifacts {s.key}/{filename}": "sha256 differs"})
        os.replace(temp, dest)
        return dest

    def delete_artifacts(self, name: str, version: str, key: str) -> bool:
        """Remove the set ``key`` of ``name@version``; whether there was one."""
        validate_name(key, "artifact key")
        base = artifacts_prefix(name, version)
        existed = self.backend.is_file(f"{base}/{key}{RECORD_SUFFIX}")
        self.backend.delete_tree(f"{base}/{key}{RECORD_SUFFIX}")
        self.backend.delete_tree(f"{base}/{key}")
        return existed


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
