"""Versioned model registry: atomic immutable publishes, aliases, verification, GC.

Layout under the root (keys are the same on any backend)::

    <name>/versions/<version>/manifest.json   # + weights and other listed files
    <name>/versions/<version>/eval.json       # annex: may be replaced after publish
    <name>/versions/<version>/.load_check.json  # the load check passed these files (``load_receipts``)
    <name>/aliases.json                       # alias -> version (+ canary, shadow), rollback stack, log
    <name>/gate.json                          # optional: the evaluation gate's policy
    <name>/artifacts/<version>/...            # files derived from a version (see ``artifacts``)
    <name>/.lock                              # writers of <name> serialise on it
    <name>/.staging-<random>/                 # publish in progress, invisible to readers

Readers never lock: a version appears in one rename once complete and is never
modified, and ``aliases.json`` is replaced atomically, so a server can poll
``alias_target`` (or ``alias_entry``) cheaply and hot-swap versions without coordinating with
writers. The alias side (moves, the evaluation gate, the log) is in ``alias_moves``.
"""

from __future__ import annotations

import io
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from model_store.alias_moves import AliasMoves, GateHook, check_reason
from model_store.aliases import ALIASES_FILE
from model_store.artifacts import ARTIFACTS_DIR, VersionArtifacts
from model_store.backends import StorageBackend
from model_store.backends.base import TRASH_PREFIX
from model_store.errors import (
    ChecksumMismatch,
    InvalidName,
    ModelNotFound,
    StoreError,
    VersionExists,
    VersionRefused,
)
from model_store.integrity import VersionValidator, manifest_problems
from model_store.load_receipts import RECEIPT_FILE, passed_at, receipt
from model_store.location import open_backend
from model_store.manifest import ANNEX_FILES, Manifest
from model_store.naming import (
    MANIFEST_FILE,
    is_valid_name,
    next_version,
    parse_ref,
    sort_versions,
    validate_filename,
    validate_name,
)
from model_store.staging import (
    FileSource,
    build_manifest,
    check_files,
    check_local_files,
    manifest_error,
    publish_fields,
    stage_files,
    validate_publish_names,
)

VERSIONS_DIR = "versions"
LOCK_FILE = ".lock"
STAGING_PREFIX = ".staging-"
# gc leaves staging areas written to more recently than this alone: a publish may be filling
# them (a publish holds no lock while it uploads, checks and load-tests its files).
STAGING_GRACE_S = 3600.0


class ModelStore(AliasMoves, VersionArtifacts):
    """Registry of model versions on a ``StorageBackend``, or at a location (a path or ``s3://``).

    ``validator`` (optional) proves a version loads and runs before ``publish`` commits it and
    before ``promote`` (or ``canary``, ``shadow``) points an alias at it; the store itself only
    knows files and manifests. Files derived from a version elsewhere (exported graphs, a measured
    decision) are kept beside it as artifact sets (``VersionArtifacts``).
    """

    def __init__(
        self, root: str | os.PathLike[str] | StorageBackend, validator: VersionValidator | None = None
    ) -> None:
        self.backend: StorageBackend = root if isinstance(root, StorageBackend) else open_backend(root)
        self.validator = validator

    def __repr__(self) -> str:
        return f"ModelStore({self.backend!r})"

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _vkey(name: str, version: str, *rest: str) -> str:
        return "/".join((name, VERSIONS_DIR, version, *rest))

    def _lock(self, name: str, break_lock: bool = False) -> AbstractContextManager[None]:
        return self.backend.lock(f"{name}/{LOCK_FILE}", break_existing=break_lock)

    def _version_exists(self, name: str, version: str) -> bool:
        return self.backend.is_file(self._vkey(name, version, MANIFEST_FILE))

    def _require_model(self, name: str) -> None:
        validate_name(name, "model name")
        if not self.backend.is_dir(name):
            raise ModelNotFound(f"model {name!r} not found")

    def _require_version(self, name: str, version: str) -> None:
        validate_name(name, "model name")
        validate_name(version, "version")
        if not self._version_exists(name, version):  # one request when it exists; the model's only when not
            self._require_model(name)
            raise ModelNotFound(f"version {name}@{version} not found")

    @staticmethod
    def _require_annex(filename: str) -> None:
        if filename not in ANNEX_FILES:
            raise InvalidName(f"{filename!r} is not an annex file (allowed: {', '.join(sorted(ANNEX_FILES))})")

    def _versions(self, name: str) -> list[str]:
        base = f"{name}/{VERSIONS_DIR}"
        names = self.backend.list_dir(base)
        return sort_versions([v for v in names if is_valid_name(v) and self._version_exists(name, v)])

    # ------------------------------------------------------------------ reading
    def list_models(self) -> list[str]:
        """Names of models that have versions or aliases."""
        return [
            name
            for name in self.backend.list_dir("")
            if is_valid_name(name)
            and (self.backend.is_dir(f"{name}/{VERSIONS_DIR}") or self.backend.is_file(f"{name}/{ALIASES_FILE}"))
        ]

    def list_versions(self, name: str) -> list[str]:
        """Published versions of ``name``, oldest first in natural order (``v2`` < ``v10``)."""
        self._require_model(name)
        return self._versions(name)

    def version_dir(self, name: str, version: str) -> Path:
        """Local directory holding the files of ``name@version``."""
        self._require_version(name, version)
        return self.backend.local_path(self._vkey(name, version))

    def manifest(self, name: str, version: str) -> Manifest:
        """Parsed manifest of ``name@version`` (not verified; see ``load_verified``)."""
        self._require_version(name, version)
        return self._parse_manifest(self.backend.read_bytes(self._vkey(name, version, MANIFEST_FILE)), name, version)

    @staticmethod
    def _parse_manifest(raw: bytes, name: str, version: str) -> Manifest:
        try:
            return Manifest.from_json(raw)
        except ValidationError as exc:
            raise manifest_error(exc, f"{name}@{version}/{MANIFEST_FILE}") from None

    def file_path(self, name: str, version: str, filename: str) -> Path:
        """Path of a file listed in the manifest, or of an annex file that exists."""
        validate_filename(filename)
        manifest = self.manifest(name, version)
        key = self._vkey(name, version, filename)
        if filename not in manifest.files and not (filename in ANNEX_FILES and self.backend.is_file(key)):
            raise ModelNotFound(f"{name}@{version} has no file {filename!r}")
        return self.backend.local_path(key)

    def annex_files(self, name: str, version: str) -> list[str]:
        """Annex files currently present for ``name@version``."""
        self._require_version(name, version)
        return sorted(f for f in ANNEX_FILES if self.backend.is_file(self._vkey(name, version, f)))

    def copy(
        self, name: str, version: str, to_name: str, to_version: str | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> Manifest:  # fmt: skip
        """Publish a byte copy of ``name@version`` as ``to_name@to_version`` (the next ``vN`` when
        None), annex files included, moving no alias: a rehearsal candidate (``model_store.copying``)."""
        from model_store.copying import copy_version

        return copy_version(self, name, version, to_name, to_version, on_step)

    def resolve(self, ref: str) -> tuple[str, str]:
        """Resolve ``name@alias``, ``name@version`` or bare ``name`` (= ``name@production``).

        Aliases win over literal versions so ``production`` always means the alias.
        """
        name, selector = parse_ref(ref)
        self._require_model(name)
        version = self._read_aliases(name).target(selector)
        if version is None:
            if not self._version_exists(name, selector):
                raise ModelNotFound(f"model {name!r} has no alias or version {selector!r}")
            return name, selector
        if not self._version_exists(name, version):
            raise ModelNotFound(f"alias {name}@{selector} points to missing version {version!r}")
        return name, version

    # ------------------------------------------------------------------ verification
    def verify(self, name: str, version: str) -> None:
        """Recompute every listed file's sha256; raise ``ChecksumMismatch`` naming the bad or missing ones."""
        self._verified_manifest(name, version)

    def load_verified(self, name: str, version: str) -> tuple[Manifest, Path]:
        """Verify ``name@version`` and return its manifest and directory: the entry point for loaders.

        The files verified are the local copies the loader reads (on object storage: downloaded
        once, or found in the node's cache), so nothing is fetched twice and nothing changes
        between the check and the load."""
        self._require_version(name, version)
        directory = self.backend.local_path(self._vkey(name, version))
        try:
            raw = (directory / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            raise ModelNotFound(f"version {name}@{version} not found") from None  # deleted meanwhile
        manifest = self._parse_manifest(raw, name, version)
        self._raise_problems(manifest, name, version, check_local_files(directory, manifest.files))
        return manifest, directory

    def _verified_manifest(self, name: str, version: str) -> Manifest:
        manifest = self.manifest(name, version)
        self._raise_problems(
            manifest, name, version, check_files(self.backend, self._vkey(name, version), manifest.files)
        )
        return manifest

    @staticmethod
    def _raise_problems(manifest: Manifest, name: str, version: str, file_problems: dict[str, str]) -> None:
        problems: dict[str, str] = {}
        if (manifest.name, manifest.version) != (name, version):
            problems[MANIFEST_FILE] = f"describes {manifest.ref}"
        problems.update(manifest_problems(manifest))
        problems.update(file_problems)
        if problems:
            raise ChecksumMismatch(name, version, problems)

    # ------------------------------------------------------------------ writing
    def publish(
        self,
        name: str,
        files: Mapping[str, FileSource],
        manifest_fields: Mapping[str, Any],
        version: str | None = None,
        aliases: Sequence[str] = (),
        on_step: Callable[[str], None] | None = None,
        on_gate: GateHook | None = None,
        force: bool = False,
        reason: str | None = None,
    ) -> Manifest:
        """Publish a new immutable version atomically and optionally point aliases at it (through the
        evaluation gate: a refused alias raises ``GateRefused`` after the version is published).

        Files are staged in a private directory, fsynced, hashed, re-read and checked,
        then the manifest is written and the directory renamed into ``versions/`` in one
        step; on any failure the staging directory is removed and nothing is visible.
        ``manifest_fields`` holds every manifest field except ``files`` (computed);
        ``name``/``version`` may be repeated there but must agree with the arguments.

        ``on_step`` is called with one line as each step completes (``staged ... in
        <name>/.staging-...``, ``published name@vN (...)``, ``alias <alias> -> vN``), so the
        output of a process killed half-way says what it left: a staging area for ``gc``, or a
        version that no alias points to yet. It must not raise: that would stop the publish
        where it is. ``on_gate`` is called with the gate's report for each alias, before it moves;
        ``force`` (with a ``reason``, kept in the alias history) moves them even if the gate refuses.
        """
        step = on_step or _ignore_step
        fields, version = publish_fields(name, version, manifest_fields)
        for alias in aliases:
            validate_name(alias, "alias")
        reason = check_reason(force, reason)
        validate_publish_names(list(files))
        build_manifest({**fields, "version": version or "v1"})  # fail before copying weights
        if version is not None and self._version_exists(name, version):
            raise VersionExists(f"{name}@{version} already exists; versions are immutable")

        staging = f"{name}/{STAGING_PREFIX}{secrets.token_hex(8)}"
        try:
            entries = stage_files(self.backend, staging, files)
            if problems := check_files(self.backend, staging, entries):
                raise ChecksumMismatch(name, version or "<new>", problems)
            staged_bytes = sum(entry.bytes for entry in entries.values())
            step(f"staged {name} ({len(entries)} files, {staged_bytes:,} bytes) in {staging}")
            self._validate(build_manifest({**fields, "version": version or "v1", "files": entries}), staging)
            with self._lock(name):
                final = version or next_version(self._versions(name))
                manifest = build_manifest({**fields, "version": final, "files": entries})
                manifest_key = f"{staging}/{MANIFEST_FILE}"
                self.backend.put(manifest_key, io.BytesIO(manifest.to_json().encode()))
                if Manifest.from_json(self.backend.read_bytes(manifest_key)) != manifest:
                    raise ChecksumMismatch(name, final, {MANIFEST_FILE: "read-back differs"})
                try:
                    self.backend.commit_dir(staging, self._vkey(name, final))
                except FileExistsError:
                    raise VersionExists(f"{name}@{final} already exists; versions are immutable") from None
                step(f"published {manifest.ref} ({len(entries)} files, {staged_bytes:,} bytes)")
                if aliases:  # gated: a refusal leaves the version published and the aliases unmoved
                    self._point_published(name, final, aliases, on_gate, force, reason)
                    for alias in aliases:
                        step(f"alias {alias} -> {final}")
        except BaseException:
            self.backend.delete_tree(staging)
            raise
        return manifest

    def _validate(
        self, manifest: Manifest, key: str, on_step: Callable[[str], None] | None = None, trust_receipt: bool = False
    ) -> None:
        """Refuse a version that depends on files outside it or that the validator cannot run.

        A pass leaves a receipt under ``key`` (``model_store.load_receipts``); with ``trust_receipt``
        (alias moves) a receipt of these files and validators stands for the check. ``on_step``
        hears what is being waited for."""
        if problems := manifest_problems(manifest):
            raise VersionRefused(manifest.ref, "; ".join(f"{k}: {why}" for k, why in sorted(problems.items())))
        if self.validator is None:
            return
        step = on_step or _ignore_step
        identity = getattr(self.validator, "identity", None)
        validators: list[str] = identity() if callable(identity) else []
        receipt_key = f"{key}/{RECEIPT_FILE}"
        if trust_receipt and validators:
            try:
                raw: bytes | None = self.backend.read_bytes(receipt_key)
            except FileNotFoundError:
                raw = None
            if (when := passed_at(raw, manifest, validators)) is not None:
                step(f"load check of {manifest.ref}: passed at {when} with these files and validators, not run again")
                return
        step(f"load check of {manifest.ref}: building the model and running one image and two texts through it")
        started = time.perf_counter()
        try:
            self.validator(manifest, self.backend.local_path(key))
        except Exception as exc:  # any failure to build or run the model is the reason to refuse it
            raise VersionRefused(manifest.ref, str(exc) or type(exc).__name__) from exc
        step(f"load check of {manifest.ref}: passed in {time.perf_counter() - started:.1f} s")
        if validators:
            try:
                self.backend.put_atomic(receipt_key, receipt(manifest, validators))
            except (OSError, StoreError) as exc:  # a read-only store: the next move checks again
                step(f"load check of {manifest.ref}: no receipt kept ({exc})")

    def read_annex(self, name: str, version: str, filename: str) -> bytes | None:
        """The contents of an annex file (e.g. ``eval.json``) of ``name@version``, ``None`` when
        it has none: one read, never a local copy (on S3 the blob cache is for weights)."""
        self._require_annex(filename)
        self._require_version(name, version)
        try:
            return self.backend.read_bytes(self._vkey(name, version, filename))
        except FileNotFoundError:
            return None

    def write_annex(self, name: str, version: str, filename: str, data: bytes) -> Path:
        """Add or atomically replace an annex file (e.g. ``eval.json``) of a published version."""
        self._require_annex(filename)
        self._require_version(name, version)
        key = self._vkey(name, version, filename)
        self.backend.put_atomic(key, bytes(data))
        return self.backend.local_path(key)

    def gc(
        self, name: str, keep_latest: int = 0, dry_run: bool = False, staging_grace_s: float = STAGING_GRACE_S
    ) -> list[str]:
        """Remove unreferenced versions and stale staging dirs; return what was (or would be) removed.

        Kept: versions an alias points to or may roll back to, and the newest
        ``keep_latest`` versions in natural order. Staging dirs (what a killed or crashed
        publish leaves) are removed once nothing was written to them for ``staging_grace_s``
        seconds (an hour by default); younger ones may belong to a publish still running and are
        left alone (0 removes them all). Also cleared: what an interrupted delete or commit left
        (trash folders, and version folders without a manifest, which no reader sees); commits
        hold the lock gc holds. The artifacts of a removed version (or of none left) go with it.
        """
        if keep_latest < 0:
            raise StoreError("keep_latest must be >= 0")
        if staging_grace_s < 0:
            raise StoreError("staging_grace_s must be >= 0")
        self._require_model(name)
        removed: list[str] = []
        with self._lock(name):
            versions = self._versions(name)
            keep = self._read_aliases(name).referenced()
            keep.update(versions[-keep_latest:] if keep_latest else [])
            for version in versions:
                if version not in keep:
                    removed.append(version)
                    if not dry_run:  # the backend hides the version from readers first
                        self.backend.delete_tree(self._vkey(name, version))
            for entry in self.backend.list_dir(f"{name}/{VERSIONS_DIR}"):
                if entry not in versions and entry not in keep:  # no manifest: never visible to readers
                    removed.append(f"{VERSIONS_DIR}/{entry}")
                    if not dry_run:
                        self.backend.delete_tree(self._vkey(name, entry))
            remaining = {v for v in versions if v not in removed}
            for entry in self.backend.list_dir(f"{name}/{ARTIFACTS_DIR}"):
                if entry not in remaining:
                    removed.append(f"{ARTIFACTS_DIR}/{entry}")
                    if not dry_run:
                        self.backend.delete_tree(f"{name}/{ARTIFACTS_DIR}/{entry}")
            for entry in self.backend.list_dir(name):
                stale = entry.startswith(STAGING_PREFIX) and self._stale(f"{name}/{entry}", staging_grace_s)
                if stale or entry.startswith(TRASH_PREFIX):
                    removed.append(entry)
                    if not dry_run:
                        self.backend.delete_tree(f"{name}/{entry}")
        return removed

    def _stale(self, key: str, grace_s: float) -> bool:
        if grace_s <= 0:  # every one, whatever the clocks of this machine and the store say
            return True
        try:
            return time.time() - self.backend.mtime(key) > grace_s
        except FileNotFoundError:  # a failed publish cleaned up after itself meanwhile
            return False


def _ignore_step(_message: str) -> None:
    pass
