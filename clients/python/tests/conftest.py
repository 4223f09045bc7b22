"""Fixtures of the client tests: a scripted real HTTP server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from scripted_server import ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    srv.start()
    yield srv
    srv.stop()
