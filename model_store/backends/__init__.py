"""Storage backends of the model store (blob I/O only)."""

from model_store.backends.base import Readable, StorageBackend
from model_store.backends.local import LocalBackend

__all__ = ["LocalBackend", "Readable", "StorageBackend"]
