"""Publishing, immutability, verification and annex files on a real directory tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Root
from model_store_helpers import manifest_fields, publish_simple

from model_store import (
    ChecksumMismatch,
    InvalidManifest,
    InvalidName,
    ModelNotFound,
    ModelStore,
    StoreError,
    VersionExists,
)


def _leftovers(root: Root, name: str = "clip") -> list[str]:
    return [entry for entry in root.children(name) if entry.startswith(".staging-")]


def test_publish_resolve_verify_roundtrip(
    store: ModelStore, root: Root, tmp_path: Path, fields: dict[str, Any]
) -> None:
    weights = tmp_path / "src.safetensors"
    weights.write_bytes(b"\x00" * 4096)
    manifest = store.publish(
        "clip",
        {"model.safetensors": weights, "onnx/visual.onnx": b"onnx-bytes", "comparatives.json": b"[]"},
        fields,
        aliases=["production"],
    )
    assert manifest.ref == "clip@v1"
    assert sorted(manifest.files) == ["comparatives.json", "model.safetensors", "onnx/visual.onnx"]
    assert manifest.files["model.safetensors"].bytes == 4096
    assert store.resolve("clip") == ("clip", "v1")

    loaded, directory = store.load_verified("clip", "v1")
    assert loaded == manifest
    assert directory == store.version_dir("clip", "v1") and directory.is_dir()
    assert (directory / "onnx" / "visual.onnx").read_bytes() == b"onnx-bytes"
    on_disk = json.loads((directory / "manifest.json").read_text())
    assert list(on_disk) == sorted(on_disk) and on_disk["files"]["onnx/visual.onnx"]["bytes"] == 10
    assert store.file_path("clip", "v1", "model.safetensors") == directory / "model.safetensors"
    with pytest.raises(ModelNotFound):
        store.file_path("clip", "v1", "other.bin")
    assert _leftovers(root) == []
    assert store.list_models() == ["clip"]
    # A blob is a file, its folder is not (on object storage one HEAD answers either way).
    assert store.backend.is_file("clip/versions/v1/manifest.json")
    assert not store.backend.is_file("clip/versions/v1") and not store.backend.is_file("clip/versions/v9/manifest.json")


def test_auto_versions_increment_naturally(store: ModelStore) -> None:
    assert [publish_simple(store, bytes([i])) for i in range(11)] == [f"v{i}" for i in range(1, 12)]
    assert store.list_versions("clip")[-3:] == ["v9", "v10", "v11"]
    assert publish_simple(store, version="release-a") == "release-a"
    assert publish_simple(store) == "v12"


def test_versions_are_immutable(store: ModelStore, root: Root) -> None:
    publish_simple(store, b"original", version="v1")
    with pytest.raises(VersionExists):
        publish_simple(store, b"replacement", version="v1")
    assert root.read("clip/versions/v1/model.safetensors") == b"original"
    store.verify("clip", "v1")
    assert _leftovers(root) == []


def test_failed_publish_leaves_nothing_visible(store: ModelStore, root: Root, tmp_path: Path) -> None:
    files = {"a.safetensors": b"first file is written", "b.safetensors": tmp_path / "does-not-exist"}
    with pytest.raises(StoreError, match="does-not-exist"):
        store.publish("clip", files, manifest_fields(), version="v1")
    assert not root.exists("clip/versions/v1")
    assert _leftovers(root) == []
    assert store.list_models() == []
    assert publish_simple(store) == "v1"  # the name was not burnt


def test_invalid_manifest_fails_before_staging(store: ModelStore, root: Root) -> None:
    fields = manifest_fields()
    del fields["embed_dim"]
    with pytest.raises(InvalidManifest, match="embed_dim"):
        store.publish("clip", {"model.safetensors": b"x"}, fields)
    with pytest.raises(InvalidManifest, match="files"):
        store.publish("clip", {"model.safetensors": b"x"}, manifest_fields(files={}))
    with pytest.raises(InvalidManifest, match="name"):
        store.publish("clip", {"model.safetensors": b"x"}, manifest_fields(name="other"))
    assert not root.exists() or _leftovers(root) == []


@pytest.mark.parametrize("filename", ["manifest.json", "../escape.bin", "/abs.bin", "a/../../b"])
def test_publish_rejects_bad_filenames(store: ModelStore, filename: str) -> None:
    with pytest.raises(InvalidName):
        store.publish("clip", {filename: b"x"}, manifest_fields())


def test_publish_rejects_file_directory_clash(store: ModelStore) -> None:
    with pytest.raises(InvalidName):
        store.publish("clip", {"onnx": b"x", "onnx/visual.onnx": b"y"}, manifest_fields())


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden"])
def test_publish_rejects_bad_model_names(store: ModelStore, root: Root, name: str) -> None:
    with pytest.raises(InvalidName):
        store.publish(name, {"model.safetensors": b"x"}, manifest_fields())
    assert not root.exists()


def test_corrupted_file_fails_verification(store: ModelStore, root: Root) -> None:
    publish_simple(store, b"good weights")
    root.write("clip/versions/v1/model.safetensors", b"evil weights")
    with pytest.raises(ChecksumMismatch) as info:
        store.verify("clip", "v1")
    assert info.value.problems == {"model.safetensors": "sha256 mismatch"}
    assert "model.safetensors" in str(info.value)
    with pytest.raises(ChecksumMismatch):
        store.load_verified("clip", "v1")


def test_missing_and_truncated_files_fail_verification(store: ModelStore, root: Root) -> None:
    store.publish("clip", {"model.safetensors": b"abc", "text.safetensors": b"defg"}, manifest_fields())
    root.delete("clip/versions/v1/model.safetensors")
    root.write("clip/versions/v1/text.safetensors", b"de")
    with pytest.raises(ChecksumMismatch) as info:
        store.verify("clip", "v1")
    assert info.value.problems == {"model.safetensors": "missing", "text.safetensors": "2 bytes, expected 4"}
    with pytest.raises(ChecksumMismatch) as info:  # the loader's path checks the copies it would read
        store.load_verified("clip", "v1")
    assert info.value.problems == {"model.safetensors": "missing", "text.safetensors": "2 bytes, expected 4"}


def test_unknown_versions_and_models(store: ModelStore) -> None:
    with pytest.raises(ModelNotFound, match="model 'clip' not found"):
        store.verify("clip", "v1")
    publish_simple(store)
    with pytest.raises(ModelNotFound, match="version clip@v2 not found"):
        store.manifest("clip", "v2")
    with pytest.raises(ModelNotFound, match="version clip@v2 not found"):
        store.load_verified("clip", "v2")
    with pytest.raises(KeyError):  # ModelNotFound is also a KeyError
        store.version_dir("clip", "v2")
    with pytest.raises(InvalidName):
        store.version_dir("clip", "../v1")


def test_annex_is_atomic_and_outside_checksums(store: ModelStore, root: Root) -> None:
    manifest = store.publish("clip", {"model.safetensors": b"w", "eval.json": b'{"acc": 0.1}'}, manifest_fields())
    assert "eval.json" not in manifest.files
    assert store.annex_files("clip", "v1") == ["eval.json"]

    assert store.read_annex("clip", "v1", "eval.json") == b'{"acc": 0.1}'
    path = store.write_annex("clip", "v1", "eval.json", b'{"acc": 0.9}')
    assert path == store.file_path("clip", "v1", "eval.json")
    assert store.read_annex("clip", "v1", "eval.json") == b'{"acc": 0.9}'
    assert json.loads(path.read_text()) == {"acc": 0.9}
    assert root.children("clip/versions/v1") == ["eval.json", "manifest.json", "model.safetensors"]
    assert store.manifest("clip", "v1") == manifest
    store.verify("clip", "v1")

    with pytest.raises(InvalidName):
        store.write_annex("clip", "v1", "model.safetensors", b"overwrite")
    with pytest.raises(InvalidName):  # weights are read through load_verified, checksummed
        store.read_annex("clip", "v1", "model.safetensors")
    with pytest.raises(ModelNotFound):
        store.write_annex("clip", "v9", "eval.json", b"{}")


def test_annex_absent_until_written(store: ModelStore) -> None:
    publish_simple(store)
    assert store.annex_files("clip", "v1") == []
    assert store.read_annex("clip", "v1", "eval.json") is None
    with pytest.raises(ModelNotFound):
        store.file_path("clip", "v1", "eval.json")
    with pytest.raises(ModelNotFound):
        store.read_annex("clip", "v9", "eval.json")


def test_manifest_version_field_may_repeat_argument(store: ModelStore) -> None:
    assert (
        store.publish("clip", {"model.safetensors": b"x"}, manifest_fields(name="clip", version="v7")).version == "v7"
    )
    with pytest.raises(InvalidManifest):
        store.publish("clip", {"m.bin": b"x"}, manifest_fields(version="v8"), version="v9")


def test_plain_string_sources_are_refused(store: ModelStore) -> None:
    with pytest.raises(TypeError):
        store.publish("clip", {"m.bin": "is this a path or content?"}, manifest_fields())  # type: ignore[dict-item]


def test_non_finite_metrics_are_refused_before_anything_is_written(store: ModelStore) -> None:
    with pytest.raises(InvalidManifest):
        store.publish("clip", {"model.safetensors": b"w"}, manifest_fields(metrics={"acc": float("nan")}))
    assert store.list_models() == [] or store.list_versions("clip") == []
