"""Versioned, checksummed model registry used by the service, training and the CLI."""

from model_store.aliases import AliasEntry, AliasEvent, AliasTable, Canary, Shadow
from model_store.artifacts import ArtifactSet
from model_store.backends import LocalBackend, StorageBackend
from model_store.errors import (
    ChecksumMismatch,
    GateRefused,
    InvalidManifest,
    InvalidName,
    InvalidStoreLocation,
    ModelNotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
    VersionExists,
    VersionRefused,
    WriteConflict,
)
from model_store.gate import GatePolicy, GateReport
from model_store.integrity import VersionValidator
from model_store.location import open_backend
from model_store.manifest import ANNEX_FILES, FileEntry, Manifest
from model_store.naming import DEFAULT_ALIAS, natural_key, parse_ref, sort_versions
from model_store.routing import route, shadow_target
from model_store.store import ModelStore

__all__ = [
    "ANNEX_FILES",
    "ArtifactSet",
    "DEFAULT_ALIAS",
    "AliasEntry",
    "AliasEvent",
    "AliasTable",
    "Canary",
    "ChecksumMismatch",
    "FileEntry",
    "GatePolicy",
    "GateRefused",
    "GateReport",
    "InvalidManifest",
    "InvalidName",
    "InvalidStoreLocation",
    "LocalBackend",
    "Manifest",
    "ModelNotFound",
    "ModelStore",
    "PreconditionFailed",
    "Shadow",
    "StorageBackend",
    "StoreError",
    "StoreUnavailable",
    "VersionExists",
    "VersionRefused",
    "VersionValidator",
    "WriteConflict",
    "natural_key",
    "open_backend",
    "parse_ref",
    "route",
    "shadow_target",
    "sort_versions",
]
