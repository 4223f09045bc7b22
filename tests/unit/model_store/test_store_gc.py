"""Garbage collection keeps referenced and recent versions and clears stale staging."""

from __future__ import annotations

import time
from pathlib import Path

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


def test_gc_clears_what_interrupted_deletes_and_commits_left(five: ModelStore, root: Root) -> None:
    """Files of a version without its manifest (an object-store delete or commit cut short) and a
    trash folder (a local delete cut short) are invisible to readers; gc removes them, and only them."""
    root.write("clip/versions/v9/model.safetensors", b"orphan")
    root.write("clip/versions/.trash-v7-0a1b2c3d/model.safetensors", b"half deleted")
    assert five.list_versions("clip") == ["v1", "v2", "v3", "v4", "v5"]  # neither is a version
    assert sorted(five.gc("clip", keep_latest=5, dry_run=True)) == ["versions/.trash-v7-0a1b2c3d", "versions/v9"]
    assert sorted(five.gc("clip", keep_latest=5)) == ["versions/.trash-v7-0a1b2c3d", "versions/v9"]
    assert root.children("clip/versions") == ["v1", "v2", "v3", "v4", "v5"]
    for version in five.list_versions("clip"):
        five.verify("clip", version)


def test_a_local_delete_cut_short_leaves_no_visible_half_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import model_store.backends.local as local

    store = ModelStore(tmp_path)
    for i in range(2):
        publish_simple(store, bytes([i]))

    def crash(path: Path, **_: object) -> None:  # the process dies before removing any file
        raise KeyboardInterrupt

    monkeypatch.setattr(local.shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        store.gc("clip", keep_latest=1)
    assert store.list_versions("clip") == ["v2"]  # v1 vanished in one rename, not file by file
    (trash,) = (p.name for p in (tmp_path / "clip" / "versions").iterdir() if p.name != "v2")
    assert trash.startswith(".trash-v1-")
    monkeypatch.undo()
    assert store.gc("clip", keep_latest=1) == [f"versions/{trash}"]
    assert sorted(p.name for p in (tmp_path / "clip" / "versions").iterdir()) == ["v2"]


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
