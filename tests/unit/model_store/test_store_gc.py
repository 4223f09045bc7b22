"""Garbage collection keeps referenced and recent versions and clears stale staging."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from model_store_helpers import publish_simple

from model_store import ModelNotFound, ModelStore, StoreError


@pytest.fixture
def five(store: ModelStore) -> ModelStore:
    for i in range(5):
        publish_simple(store, bytes([i]))
    store.promote("clip", "production", "v1")
    store.promote("clip", "production", "v3")  # v1 stays in history
    store.promote("clip", "staging", "v4")
    return store


def test_gc_keeps_aliases_history_and_newest(five: ModelStore, root: Path) -> None:
    assert five.gc("clip", keep_latest=1, dry_run=True) == ["v2"]
    assert five.list_versions("clip") == ["v1", "v2", "v3", "v4", "v5"]

    assert five.gc("clip", keep_latest=1) == ["v2"]
    assert five.list_versions("clip") == ["v1", "v3", "v4", "v5"]
    assert five.gc("clip") == ["v5"]
    assert five.list_versions("clip") == ["v1", "v3", "v4"]
    assert sorted(p.name for p in (root / "clip").iterdir()) == [".lock", "aliases.json", "versions"]
    for version in five.list_versions("clip"):
        five.verify("clip", version)
    assert five.rollback("clip", "production") == "v1"


def test_gc_removes_only_stale_staging(five: ModelStore, root: Path) -> None:
    stale, fresh = root / "clip/.staging-old", root / "clip/.staging-new"
    for directory in (stale, fresh):
        directory.mkdir()
        (directory / "partial.bin").write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    assert five.gc("clip", keep_latest=5, dry_run=True) == [".staging-old"]
    assert stale.exists()
    assert five.gc("clip", keep_latest=5) == [".staging-old"]
    assert not stale.exists() and fresh.exists()


def test_gc_keep_more_than_exist(store: ModelStore) -> None:
    for i in range(3):
        publish_simple(store, bytes([i]))
    assert store.gc("clip", keep_latest=10) == []
    assert store.gc("clip", keep_latest=2) == ["v1"]


def test_gc_argument_errors(five: ModelStore) -> None:
    with pytest.raises(StoreError):
        five.gc("clip", keep_latest=-1)
    with pytest.raises(ModelNotFound):
        five.gc("other")
