"""Optional API-key authentication (``Authorization: Bearer <key>``).

Off when no key is configured. Keys come from settings and/or a file with one key per line
(blank lines and ``#`` comments ignored), typically a mounted Kubernetes Secret: the file is
re-read when its modification time changes, so keys rotate without a restart. Keys are compared
in constant time against every configured key (no early exit that would leak which one matched).
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from service.api.errors import ApiError, ErrorCode
from service.config import Settings

log = logging.getLogger("service.auth")

# Probes and scrapers must work without credentials; the API description is no secret either, nor
# is the playground page (/), which holds no data: the API calls it makes need a key.
PUBLIC_PATHS: frozenset[str] = frozenset({"/", "/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"})
# The API reference pages' and the playground's own static files (scripts, styles, example images).
PUBLIC_PREFIXES: tuple[str, ...] = ("/docs/assets/", "/redoc/assets/", "/playground/")


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class ApiKeyAuth:
    def __init__(self, settings: Settings) -> None:
        self._static = [k.get_secret_value().encode() for k in settings.api_keys]
        self._file: Path | None = settings.api_keys_file
        self._file_keys: list[bytes] = []
        self._file_stamp: tuple[int, int] | None = None
        if self._file is not None:
            self._reload_file(initial=True)

    @property
    def enabled(self) -> bool:
        return bool(self._static) or self._file is not None

    def keys(self) -> list[bytes]:
        if self._file is not None:
            self._reload_file()
        return self._static + self._file_keys

    def _reload_file(self, initial: bool = False) -> None:
        assert self._file is not None
        try:
            st = os.stat(self._file)
        except OSError as exc:
            if initial:
                raise ValueError(f"cannot read api_keys_file {self._file}: {exc}") from None
            return  # keep the last good keys if the file vanishes during a Secret update
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._file_stamp:
            return
        lines = self._file.read_text(encoding="utf-8").splitlines()
        self._file_keys = [s.encode() for s in (line.strip() for line in lines) if s and not s.startswith("#")]
        self._file_stamp = stamp
        log.info("loaded %d API keys from %s", len(self._file_keys), self._file)

    def check(self, authorization: str | None) -> None:
        """Raise 401 for a missing/malformed header, 403 for a key that is not configured."""
        if not self.enabled:
            return
        if not authorization:
            raise ApiError(ErrorCode.unauthorized, "missing Authorization: Bearer <key> header", headers=_CHALLENGE)
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(ErrorCode.unauthorized, "Authorization header must be 'Bearer <key>'", headers=_CHALLENGE)
        # The middleware decodes header bytes as latin-1 (HTTP's rule), so encoding back gives the
        # bytes the client sent: a UTF-8 key then matches its UTF-8 bytes (it never could as text).
        try:
            presented = token.encode("latin-1")
        except UnicodeEncodeError:  # a caller that passed real text, not header bytes
            presented = token.encode("utf-8")
        matched = False
        for key in self.keys():
            matched |= hmac.compare_digest(presented, key)
        if not matched:
            raise ApiError(ErrorCode.forbidden, "API key is not valid")
