"""Shared fixtures: a real store in a temporary directory and valid manifest fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from model_store_helpers import manifest_fields

from model_store import ModelStore


@pytest.fixture
def fields() -> dict[str, Any]:
    return manifest_fields()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture
def store(root: Path) -> ModelStore:
    return ModelStore(root)
