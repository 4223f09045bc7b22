"""Garbage collection keeps referenced and recent versions and clears stale staging."""

from __future__ import annotations

import time

import pytest
from conftest import Root
from model_store_helpers import publish_simple

import model_store.store
from model_store import ModelNotFound, ModelStore, StoreError


@pytest.fixture
def five(store: ModelStore) -> ModelStore:
    for i in range(5):
        publish_simple(store, bytes([i]))
    store.promote("clip", "production", "v1")
    store.promote("clip", "production", "v3")  # v1 stays in history
    store.promote("clip", "staging", "v4")
    return store


def test_gc_keeps_aliases_history_and_newest(five: ModelStore, root: Root) -> None:
    assert five.gc("clip", keep_latest=1, dry_run=True) == ["v2"]
    assert five.list_versions("clip") == ["v1", "v2", "v3", "v4", "v5"]

    assert five.gc("clip", keep_latest=1) == ["v2"]
    assert five.list_versions("clip") == ["v1", "v3", "v4", "v5"]
    assert five.gc("clip") == ["v5"]
    assert five.list_versions("clip") == ["v1", "v3", "v4"]
    assert [name for name in root.children("clip") if name != ".lock"] == ["aliases.json", "versions"]
    for version in five.list_versions("clip"):
        five.verify("clip", version)
    assert five.rollback("clip", "production") == "v1"


def test_gc_removes_only_stale_staging(five: ModelStore, root: Root, monkeypatch: pytest.MonkeyPatch) -> None:
    # Object stores cannot back-date a blob, so "stale" is made short instead: the old staging
    # area is written, then (more than the threshold, at one-second timestamp resolution, later)
    # the new one.
    root.write("clip/.staging-old/partial.bin", b"x")
    time.sleep(3.0)
    root.write("clip/.staging-new/partial.bin", b"x")
    monkeypatch.setattr(model_store.store, "STALE_STAGING_SECONDS", 1.5)

    assert five.gc("clip", keep_latest=5, dry_run=True) == [".staging-old"]
    assert root.exists("clip/.staging-old")
    assert five.gc("clip", keep_latest=5) == [".staging-old"]
    assert not root.exists("clip/.staging-old") and root.exists("clip/.staging-new")


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
