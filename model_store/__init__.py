"""Versioned, checksummed model registry used by the service, training and the CLI."""

from model_store.aliases import AliasTable
from model_store.backends import LocalBackend, StorageBackend
from model_store.errors import (
    ChecksumMismatch,
    InvalidManifest,
    InvalidName,
    InvalidStoreLocation,
    ModelNotFound,
    StoreError,
    StoreUnavailable,
    VersionExists,
    VersionRefused,
)
from model_store.integrity import VersionValidator
from model_store.location import open_backend
from model_store.manifest import ANNEX_FILES, FileEntry, Manifest
from model_store.naming import DEFAULT_ALIAS, natural_key, parse_ref, sort_versions
from model_store.store import ModelStore

__all__ = [
    "ANNEX_FILES",
    "DEFAULT_ALIAS",
    "AliasTable",
    "ChecksumMismatch",
    "FileEntry",
    "InvalidManifest",
    "InvalidName",
    "InvalidStoreLocation",
    "LocalBackend",
    "Manifest",
    "ModelNotFound",
    "ModelStore",
    "StorageBackend",
    "StoreError",
    "StoreUnavailable",
    "VersionExists",
    "VersionRefused",
    "VersionValidator",
    "natural_key",
    "open_backend",
    "parse_ref",
    "sort_versions",
]
