"""Shared fixtures: a real store on each backend (a temporary directory, a real S3 server) and
valid manifest fields. Every test that takes ``root`` or ``store`` runs on both backends; the S3
runs are marked slow (they need the session's SeaweedFS server, about 5 s to start, and a new
bucket each), so the fast subset runs the store on a directory only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from model_store_helpers import manifest_fields
from store_roots import LocalRoot, S3Root

from model_store import ModelStore

Root = LocalRoot | S3Root


@pytest.fixture
def fields() -> dict[str, Any]:
    return manifest_fields()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    if request.param == "local":
        return LocalRoot(tmp_path / "registry")
    server = request.getfixturevalue("s3_env")
    return S3Root(server, server.new_location())


@pytest.fixture
def store(root: Root) -> ModelStore:
    return root.store()
