"""Garbage collection keeps referenced and recent versions and clears stale staging."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import Root
from model_store_helpers import manifest_fields, publish_evaluated, publish_simple

from model_store import ModelNotFound, ModelStore, StoreError
from model_store.store import LOCK_FILE


@pytest.fixture
def five(store: ModelStore) -> ModelStore:
    for i in range(5):
        publish_evaluated(store, bytes([i]))
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


@pytest.mark.slow
def test_gc_removes_only_stale_staging(five: ModelStore, root: Root) -> None:
    # Object stores cannot back-date a blob, so the grace is made short instead: the old staging
    # area is written, then (more than the grace, at one-second timestamp resolution, later)
    # the new one.
    root.write("clip/.staging-old/partial.bin", b"x")
    time.sleep(3.0)
    root.write("clip/.staging-new/partial.bin", b"x")

    assert five.gc("clip", keep_latest=5, dry_run=True, staging_grace_s=1.5) == [".staging-old"]
    assert root.exists("clip/.staging-old")
    assert five.gc("clip", keep_latest=5) == []  # the default grace (an hour) keeps both
    assert five.gc("clip", keep_latest=5, staging_grace_s=1.5) == [".staging-old"]
    assert not root.exists("clip/.staging-old") and root.exists("clip/.staging-new")


def _model_store_cli(root: Root, *args: str) -> list[str]:
    # The weights are placeholder bytes: no load check.
    return [sys.executable, "-m", "model_store.cli", "--store", root.location, "--no-load-check", *args]


@pytest.mark.slow
def test_a_killed_publish_leaves_staging_that_gc_removes_after_the_grace(root: Root, tmp_path: Path) -> None:
    """``kill -9`` of ``model-store publish`` between its upload and its commit: the staging area
    stays, the run's output says so, and gc removes it once past the grace, never before."""
    src = tmp_path / "export"
    (src / "onnx").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (src / "onnx" / "visual.onnx").write_bytes(b"onnx")
    fields_file = tmp_path / "fields.json"
    fields_file.write_text(json.dumps(manifest_fields()))
    store = root.store()
    lines: queue.Queue[str] = queue.Queue()
    # The test holds the model's lock, which a publish takes only to commit: the publish uploads
    # and checks its files, says so, then waits, and is killed there, at a known point.
    command = _model_store_cli(root, "publish", "clip", str(src), "--manifest-json", str(fields_file), "-a", "prod")
    with store.backend.lock(f"clip/{LOCK_FILE}"):
        publish = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        reader = threading.Thread(target=lambda: [lines.put(line) for line in publish.stdout or ()], daemon=True)
        reader.start()
        try:
            staged = lines.get(timeout=120)
        except queue.Empty:
            staged = ""
        finally:
            publish.send_signal(signal.SIGKILL)
            publish.wait(timeout=30)
        reader.join(timeout=30)
    output = staged + "".join(lines.queue)
    assert publish.returncode == -signal.SIGKILL
    assert staged.startswith("staged clip (2 files, 3,145,732 bytes) in clip/.staging-"), output
    assert "published" not in output  # where it stopped: nothing committed, no alias moved
    leftover = staged.split(" in clip/")[1].strip()
    assert [e for e in root.children("clip") if e.startswith(".staging-")] == [leftover]
    assert store.list_versions("clip") == []

    # A fresh staging area may belong to a publish still running: the default grace keeps it.
    assert store.gc("clip") == []
    gc = subprocess.run(_model_store_cli(root, "gc", "clip"), capture_output=True, text=True, check=True)
    assert "nothing to remove" in gc.stdout
    assert root.exists(f"clip/{leftover}")
    # This one is known to be dead: a grace of 0 removes it.
    gc = subprocess.run(
        _model_store_cli(root, "gc", "clip", "--staging-grace", "0"), capture_output=True, text=True, check=True
    )
    assert f"removed: {leftover}" in gc.stdout
    assert not root.exists(f"clip/{leftover}")


def test_a_staging_dir_being_written_deep_inside_is_not_stale(tmp_path: Path) -> None:
    """On a local disk a folder's mtime moves only when entries are added to it: a staging area
    whose folders are old while a file in it is still being written belongs to a live publish."""
    store = ModelStore(tmp_path)
    publish_simple(store, aliases=["production"])
    two_hours_ago = time.time() - 7200
    for leftover, file_age in ((".staging-busy", None), (".staging-dead", two_hours_ago)):
        weights = tmp_path / "clip" / leftover / "onnx" / "visual.onnx"
        weights.parent.mkdir(parents=True)
        weights.write_bytes(b"partial")
        if file_age is not None:
            os.utime(weights, (file_age, file_age))
        for folder in (weights.parent, weights.parent.parent):
            os.utime(folder, (two_hours_ago, two_hours_ago))
    assert store.gc("clip") == [".staging-dead"]
    assert (tmp_path / "clip" / ".staging-busy" / "onnx" / "visual.onnx").is_file()


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
    with pytest.raises(StoreError):
        five.gc("clip", staging_grace_s=-1)
    with pytest.raises(ModelNotFound):
        five.gc("other")
