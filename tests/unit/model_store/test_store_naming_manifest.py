"""Names, references, version ordering and the manifest schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_store_helpers import manifest_fields
from pydantic import ValidationError

from model_store import InvalidName, Manifest, parse_ref, sort_versions
from model_store.naming import next_version, validate_filename, validate_name


def test_natural_version_sort() -> None:
    assert sort_versions(["v10", "v2", "v1", "v9", "v11"]) == ["v1", "v2", "v9", "v10", "v11"]
    assert sort_versions(["2024-10-01", "2024-9-30"]) == ["2024-9-30", "2024-10-01"]


def test_next_version_skips_custom_names() -> None:
    assert next_version([]) == "v1"
    assert next_version(["v1", "v9", "release-20"]) == "v10"


def test_parse_ref_defaults_to_production() -> None:
    assert parse_ref("clip") == ("clip", "production")
    assert parse_ref("clip@staging") == ("clip", "staging")
    assert parse_ref("clip@v3") == ("clip", "v3")


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "..", "a b", "a\\b", "x" * 200])
def test_invalid_names_rejected(bad: str) -> None:
    with pytest.raises(InvalidName):
        validate_name(bad)


@pytest.mark.parametrize("bad", ["clip@", "@v1", "clip@../v1", "a@b@c", "../clip"])
def test_invalid_refs_rejected(bad: str) -> None:
    with pytest.raises(InvalidName):
        parse_ref(bad)


def test_filenames_may_nest_but_not_escape() -> None:
    assert validate_filename("onnx/visual.onnx") == "onnx/visual.onnx"
    for bad in ["", "/abs", "../x", "a/../b", "a//b", "a/", ".env"]:
        with pytest.raises(InvalidName):
            validate_filename(bad)


def _manifest(**overrides: object) -> Manifest:
    return Manifest.model_validate({"name": "clip", "version": "v1", **manifest_fields(), **overrides})


def test_manifest_roundtrip_is_canonical(tmp_path: Path) -> None:
    manifest = _manifest(files={"model.safetensors": {"sha256": "0" * 64, "bytes": 3}})
    path = tmp_path / "manifest.json"
    manifest.dump(path)
    text = path.read_text()
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert text.endswith("\n") and '\n  "architecture"' in text
    assert Manifest.load(path) == manifest
    assert manifest.ref == "clip@v1" and manifest.total_bytes == 3
    assert manifest.created_at.endswith("Z")


@pytest.mark.parametrize(
    "overrides",
    [
        {"unknown_key": 1},
        {"embed_dim": 0},
        {"schema_version": 2},
        {"created_at": "yesterday"},
        {"name": "../x"},
        {"files": {"../model.safetensors": {"sha256": "0" * 64, "bytes": 1}}},
        {"files": {"eval.json": {"sha256": "0" * 64, "bytes": 1}}},
        {"files": {"model.safetensors": {"sha256": "xyz", "bytes": 1}}},
        {"metrics": {"acc": "high"}},
    ],
)
def test_manifest_rejects_bad_fields(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        _manifest(**overrides)


def test_manifest_free_sections_accept_anything() -> None:
    manifest = _manifest(
        components={"text_encoders": {"pcclip": "text_pcclip.safetensors"}, "dcsm": {"layers": 3}},
        training={"lr": 1e-5, "nested": {"a": [1, 2]}},
        data={"pairs": 1200},
        hooks=["pcclip_text"],
    )
    assert manifest.components["dcsm"] == {"layers": 3}
