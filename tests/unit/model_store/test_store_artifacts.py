"""Artifact sets of a version, on a directory and on a real S3 server: written whole, read back by
key, checked against their digests when fetched, kept out of the version's folder, replaced in
one step, and removed by gc with their version."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_store_helpers import publish_simple
from store_roots import LocalRoot, S3Root

from model_store import ChecksumMismatch, InvalidName, ModelNotFound, ModelStore

Root = LocalRoot | S3Root


def _files(tmp_path: Path, **contents: bytes) -> dict[str, Path]:
    out = {}
    for name, data in contents.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[f"{name}.bin"] = path
    return out


def test_a_set_is_read_back_by_key_and_fetched_checked(store: ModelStore, root: Root, tmp_path: Path) -> None:
    version = publish_simple(store)
    assert store.artifacts("clip", version, "kind-a") is None and store.artifact_keys("clip", version) == []
    written = store.put_artifacts("clip", version, "kind-a", _files(tmp_path, graph=b"g" * 3000, side=b"s"),
                                  {"backend": "onnx", "at": 1.5})  # fmt: skip
    found = store.artifacts("clip", version, "kind-a")
    assert found == written and found.meta == {"backend": "onnx", "at": 1.5}
    assert set(found.files) == {"graph.bin", "side.bin"} and store.artifact_keys("clip", version) == ["kind-a"]
    assert store.fetch_artifact(found, "graph.bin", tmp_path / "out" / "graph.bin").read_bytes() == b"g" * 3000
    # Beside the version, never in its folder: a loader reading the version copies none of it.
    assert "artifacts" not in root.children(f"clip/versions/{version}")
    store.verify("clip", version)

    # A file changed behind the store's back is refused, and nothing is left where it was copied to.
    root.write(f"clip/artifacts/{version}/kind-a/{found.folder}/side.bin", b"tampered")
    with pytest.raises(ChecksumMismatch, match="sha256 differs"):
        store.fetch_artifact(found, "side.bin", tmp_path / "out" / "side.bin")
    assert not (tmp_path / "out" / "side.bin").exists()


def test_a_new_write_replaces_the_set_and_gc_removes_it_with_its_version(
    store: ModelStore, root: Root, tmp_path: Path
) -> None:
    v1, v2 = publish_simple(store, b"one"), publish_simple(store, b"two")
    first = store.put_artifacts("clip", v2, "kind-a", _files(tmp_path, graph=b"old"), {"n": 1})
    second = store.put_artifacts("clip", v2, "kind-a", _files(tmp_path, graph=b"new"), {"n": 2})
    assert store.artifacts("clip", v2, "kind-a") == second and second.folder != first.folder
    assert root.children(f"clip/artifacts/{v2}/kind-a") == [second.folder]  # the old write is gone
    store.put_artifacts("clip", v1, "kind-b", {}, {"backend": "torch"})  # a set without files
    assert store.delete_artifacts("clip", v1, "kind-b") and store.artifacts("clip", v1, "kind-b") is None

    store.put_artifacts("clip", v1, "kind-b", {}, {"backend": "torch"})
    assert store.gc("clip", keep_latest=1) == ["v1", "artifacts/v1"]
    assert store.artifact_keys("clip", v2) == ["kind-a"] and root.children("clip/artifacts") == [v2]


def test_names_are_checked_and_a_missing_version_takes_no_set(store: ModelStore, tmp_path: Path) -> None:
    version = publish_simple(store)
    with pytest.raises(InvalidName):
        store.put_artifacts("clip", version, "../up", {}, {})
    with pytest.raises(InvalidName):
        store.artifacts("clip", version, ".hidden")
    with pytest.raises(ModelNotFound):
        store.put_artifacts("clip", "v9", "kind-a", {}, {})
