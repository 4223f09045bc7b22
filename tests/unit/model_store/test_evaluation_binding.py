"""An eval.json names the weights it measured: the binding ``clip-train evaluate`` writes, and how
the gate tells a version's own evaluation from a copy of another's."""

from __future__ import annotations

import json
from typing import Any

from model_store_helpers import REPO, manifest_fields

from model_store import Manifest, ModelStore
from model_store.evaluation import bind, binding, provenance
from model_store.manifest import FileEntry

DIGEST = "0" * 64


def manifest(version: str, digest: str = DIGEST, **overrides: Any) -> Manifest:
    files = {"model.safetensors": FileEntry(sha256=digest, bytes=7)}
    return Manifest.model_validate({**manifest_fields(**overrides), "name": "clip", "version": version, "files": files})


def test_a_bound_report_belongs_to_its_version_and_to_the_same_files_republished() -> None:
    v6 = manifest("v6")
    report = bind({"metrics": {"a": 0.5}}, v6)
    assert report["model"] == "clip@v6" and report["version"] == binding(v6)
    assert report["version"]["files"] == {"model.safetensors": DIGEST} and len(report["version"]["config"]) == 64
    assert provenance(report, v6).belongs and not provenance(report, v6).unbound
    assert provenance(report, manifest("v9")).belongs  # the same files and configuration: the same model


def test_a_copy_into_other_weights_is_no_evaluation_of_them() -> None:
    report = bind({"metrics": {"a": 0.5}}, manifest("v6"))
    copied = provenance(report, manifest("v8", digest="1" * 64))
    assert copied.foreign == "the eval.json of v8 belongs to other weights (v6's)"
    other_config = provenance(report, manifest("v8", image_size=256))
    assert other_config.foreign == "the eval.json of v8 belongs to another configuration of these weights (v6's)"
    from_elsewhere = bind({"metrics": {}}, manifest("v6").model_copy(update={"name": "other"}))
    assert "(other@v6's)" in (provenance(from_elsewhere, manifest("v8", digest="1" * 64)).foreign or "")
    for broken in ("v6", {"files": "x", "config": "y"}, {"files": {}}):
        assert "unreadable binding" in (provenance({"version": broken}, manifest("v8")).foreign or "")


def test_reports_from_before_the_binding_are_taken_on_their_word_unless_they_name_another_version() -> None:
    assert provenance({"model": "clip@v6", "metrics": {}}, manifest("v6")).unbound
    assert provenance({"metrics": {}}, manifest("v6")).unbound
    copy = provenance({"model": "clip@v6", "metrics": {}}, manifest("v8"))
    assert copy.foreign == "the eval.json of v8 was written for clip@v6"


def test_the_committed_default_models_evaluation_is_bound_to_its_version() -> None:
    store = ModelStore(REPO / "models")
    name, version = store.resolve("default@production")
    raw = store.read_annex(name, version, "eval.json")
    assert raw is not None
    origin = provenance(json.loads(raw), store.manifest(name, version))
    assert origin.belongs and not origin.unbound
