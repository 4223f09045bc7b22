"""The lock of a writer that died holding it: free at once on a directory (flock), taken over on
S3 as soon as the holder is proven gone (its process on this machine is), not after its lease."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from model_store_helpers import hold_lock_in_process, publish_evaluated
from polling import wait_until
from store_roots import S3Root

from model_store import ModelStore, StoreError, open_backend
from model_store.backends.s3 import S3Backend
from model_store.backends.s3_lease import ObjectLease, holder_gone, process_identity


def test_a_killed_writers_local_lock_is_free_at_once(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    publish_evaluated(store, b"one", aliases=["production"])
    publish_evaluated(store, b"two")
    child = _holding(str(tmp_path / "store"), tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert store.promote("clip", "production", "v2") == "v1"  # the kernel released its flock


def test_a_holder_is_gone_only_when_this_machine_can_tell() -> None:
    mine = process_identity()
    if "started" not in mine:
        pytest.skip("no /proc: a holder's death cannot be told here")
    assert not holder_gone(mine, mine)  # this very process
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=pow, args=(2, 3))
    child.start()
    child.join()
    dead = {**mine, "pid": child.pid}
    assert holder_gone(dead, mine)
    for other in ({"host": "elsewhere"}, {"boot": "another-boot"}, {"pid_namespace": "pid:[1]"}, {"started": None}):
        assert not holder_gone({**dead, **other}, mine)  # another machine, boot or namespace: no proof
    assert not holder_gone({"owner": "crashed", "lease_s": 60}, mine)  # a body without an identity


@pytest.fixture
def s3_root(s3_env: Any) -> S3Root:
    return S3Root(s3_env, s3_env.new_location())


@pytest.mark.slow
def test_a_killed_writers_s3_lock_is_taken_over_without_waiting_out_its_lease(s3_root: S3Root, tmp_path: Path) -> None:
    store = s3_root.store()
    publish_evaluated(store, b"one", aliases=["production"])
    child = _holding(s3_root.location, tmp_path, lease_s=3600)  # only its death can free it
    backend = open_backend(s3_root.location, tmp_path / "cache")
    assert isinstance(backend, S3Backend)
    held = json.loads(s3_root.read("clip/.lock"))
    assert held["pid"] == child.pid and held["lease_s"] == 3600
    with pytest.raises(StoreError, match="timed out"):  # alive: its lock is its own
        with ObjectLease(backend.client, backend.bucket, backend._key("clip/.lock"), wait_s=1.0):
            pass
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    with ObjectLease(backend.client, backend.bucket, backend._key("clip/.lock"), wait_s=60) as lease:
        assert json.loads(s3_root.read("clip/.lock"))["owner"] == lease.owner
    assert not s3_root.exists("clip/.lock")


def _holding(location: str, tmp_path: Path, lease_s: float = 60.0) -> Any:
    """A child process that holds the model's lock until killed (it has said so once this returns)."""
    ready = tmp_path / f"ready-{os.urandom(4).hex()}"
    context = multiprocessing.get_context("spawn")
    child = context.Process(
        target=hold_lock_in_process, args=(location, str(tmp_path / "child-cache"), str(ready), lease_s)
    )
    child.start()
    wait_until(ready.exists, 120, "the child process to hold the lock")
    return child
