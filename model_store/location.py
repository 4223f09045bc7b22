"""Store locations: one place that turns ``--store`` / ``CLIP_STORE`` into a backend.

A location is a filesystem path or ``s3://bucket[/prefix]``. Anything else that looks
like a URL (``gs://…``, ``http://…``, ``s3:/bucket`` as ``pathlib`` mangles it) is an
error, never a local folder named ``gs:``.

S3 connection settings come from the standard AWS chain, so nothing secret passes
through the store's own settings or logs: ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``
(or ``endpoint_url`` in the profile) for S3-compatible servers, ``AWS_REGION``,
``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, a shared
credentials file, or a web identity (Kubernetes service account) token.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from pathlib import Path
from typing import Any

from model_store.backends import LocalBackend, StorageBackend
from model_store.errors import InvalidStoreLocation

CACHE_DIR_ENV = "CLIP_STORE_CACHE_DIR"
# A scheme of two or more letters followed by ':/' (one slash: pathlib collapses '//').
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):/")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
SUPPORTED = "a filesystem path or s3://bucket/prefix"


def default_cache_dir() -> Path:
    """``$CLIP_STORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/clip-service/store`` (``~/.cache/...``)."""
    if configured := os.environ.get(CACHE_DIR_ENV):
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "clip-service" / "store"


def parse_s3_url(location: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    if not location.startswith("s3://"):
        raise InvalidStoreLocation(f"store location {location!r} is not an s3:// URL (expected s3://bucket/prefix)")
    bucket, _, prefix = location[len("s3://") :].partition("/")
    if "@" in bucket or ":" in bucket:  # never echo what may be a secret
        raise InvalidStoreLocation(
            "an s3:// store location names only bucket and prefix; credentials and endpoint come from the "
            "AWS environment or profile (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, AWS_PROFILE, ...)"
        )
    if not _BUCKET.match(bucket):
        raise InvalidStoreLocation(f"store location {location!r}: {bucket!r} is not a valid bucket name")
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise InvalidStoreLocation(f"store location {location!r}: the prefix has empty, '.' or '..' segments")
    return bucket, prefix


def check_location(location: str | os.PathLike[str]) -> tuple[str, str] | None:
    """``(bucket, prefix)`` of an ``s3://`` location, None for a path; ``InvalidStoreLocation`` otherwise.

    Parses only (nothing is contacted), so settings can refuse a bad location at start.
    """
    text = os.fspath(location)
    match = _URL.match(text)
    if match is None:
        return None
    if match["scheme"].lower() != "s3":
        raise InvalidStoreLocation(f"unsupported store location {text!r}: expected {SUPPORTED}")
    if not text.startswith("s3://"):
        raise InvalidStoreLocation(f"store location {text!r} looks like a mangled URL; write s3://bucket/prefix")
    return parse_s3_url(text)


def missing_directory(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a filesystem path with no directory there (never for ``s3://``):
    a typo in a path must not look like an empty store."""
    return check_location(location) is None and not Path(location).is_dir()


def open_backend(location: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> StorageBackend:
    """The backend a store location names; ``cache_dir`` is the local blob cache of object stores."""
    parsed = check_location(location)
    if parsed is None:
        return LocalBackend(location)
    bucket, prefix = parsed
    from model_store.backends.s3 import S3Backend  # boto3 loads only for object stores

    return S3Backend(bucket, prefix, Path(cache_dir) if cache_dir else default_cache_dir(), s3_client())


_session_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _session(aws_environment: tuple[tuple[str, str], ...]) -> Any:
    """One boto3 session per AWS environment, as boto3's own default session: a new session parses
    the S3 API description again (a tenth of a second and more per store opened); the key makes a
    changed ``AWS_*`` variable (another endpoint, other keys) take a session of its own."""
    import boto3

    return boto3.session.Session()


def s3_client() -> object:
    """A boto3 S3 client configured from the standard AWS environment and profile."""
    from botocore.config import Config

    custom_endpoint = any(os.environ.get(v) for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    config = Config(
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        # S3-compatible servers are usually addressed by host name only, without per-bucket DNS.
        s3={"addressing_style": "path" if custom_endpoint else "auto"},
        # Newer botocore adds CRC checksums to every request by default, which several
        # S3-compatible servers reject; integrity is checked end to end with sha256 instead.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    aws_environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _session_lock:  # a boto3 session is not thread-safe; the clients it makes are
        return _session(aws_environment).client("s3", config=config)
