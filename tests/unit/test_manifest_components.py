"""A version's manifest ``components`` read as ``clipcore.models.components.Components``.

Real versions in a real store (tiny CLIPs published by ``publish_bundle``, derived by
``publish_derived``, or written by hand as another tool could); the bundle, the load check and
GET /models all read the same parsed object.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from open_clip.model import CLIP

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import build_model
from clipcore.models.components import Components, ComponentsInvalid
from clipcore.models.publish import TrainedModel, publish_bundle
from clipcore.models.validate import VersionInvalid, validate_version
from model_store import Manifest, ModelStore, VersionRefused
from service.api.routes.models import describe
from training.derive import DerivedParts, publish_derived

TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
# An entry this project does not write: a store may hold versions from other tools or older code.
LEGACY = {"file": "index.bin", "rows": 3, "built_by": "an older exporter"}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _model() -> CLIP:
    torch.manual_seed(0)
    return build_model(TINY_CLIP).eval()


def _publish_with_variant(store: ModelStore) -> Manifest:
    """m@v1: a tiny CLIP in float32 with a ``pcclip`` text encoder, its default."""
    model = _model()
    variant = {k: v + 0.01 if k.startswith("transformer.") else v for k, v in model.state_dict().items()}
    trained = TrainedModel(model, TINY_CLIP, {"pcclip": variant}, default_text_encoder="pcclip", fp16=False)
    return publish_bundle(store, "m", trained)


def _hand_written(store: ModelStore, components: dict[str, Any], name: str = "legacy") -> str:
    """A version published with ``components`` as given (no ``publish_bundle``), as another tool could."""
    weights = store.file_path("m", "v1", "model.safetensors")
    fields = {
        "architecture": TINY_CLIP,
        "context_length": 16,
        "embed_dim": 32,
        "image_size": 32,
        "preprocess": {},
        "components": components,
    }
    return store.publish(name, {"model.safetensors": weights, "index.bin": b"rows"}, fields).version


def _edited_copy(root: Path, edit: Any) -> str:
    """m@v2: a copy of m@v1 whose manifest's components are edited by hand."""
    src, dst = root / "m" / "versions" / "v1", root / "m" / "versions" / "v2"
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    edit(manifest["components"])
    manifest["version"] = "v2"
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return "v2"


def test_a_published_manifest_parses_to_what_publish_wrote(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    manifest = _publish_with_variant(store)
    assert manifest.components == {
        "weights": "model.safetensors",
        "weights_dtype": "float32",
        "text_encoders": {"pcclip": "text_pcclip.safetensors"},
        "default_text_encoder": "pcclip",
    }
    components = Components.from_manifest(manifest.components)
    assert (components.weights, components.weights_dtype) == ("model.safetensors", "float32")
    assert components.text_encoders == {"pcclip": "text_pcclip.safetensors"}
    assert components.default_text_encoder == "pcclip"
    assert components.dcsm is None and components.yukino is None and components.optional == []
    assert components.to_manifest() == manifest.components
    bundle = ModelBundle.load(store, "m@v1")
    assert bundle.components == components and bundle.default_text_encoder == "pcclip"
    assert sorted(bundle.text_models) == ["base", "pcclip"]


def test_an_unknown_component_survives_a_derived_version(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    _publish_with_variant(store)
    _hand_written(store, {"weights": "model.safetensors", "legacy_index": LEGACY})
    components = ModelBundle.load(store, "legacy@v1").components
    assert components.extra == {"legacy_index": LEGACY} and components.has("legacy_index")
    # Absent entries read as their defaults but are not written back.
    assert components.weights_dtype == "float16" and components.default_text_encoder == "base"
    assert components.to_manifest() == {"weights": "model.safetensors", "legacy_index": LEGACY}

    parts = DerivedParts(
        files={"text_x.safetensors": store.file_path("m", "v1", "text_pcclip.safetensors")},
        text_encoders={"x": "text_x.safetensors"},
        components={"note": "x is pcclip again"},
    )
    derived = publish_derived(store, "legacy@v1", parts)
    assert derived.components == {
        "weights": "model.safetensors",
        "legacy_index": LEGACY,
        "text_encoders": {"x": "text_x.safetensors"},
        "note": "x is pcclip again",
    }
    assert sorted(ModelBundle.load(store, derived.ref).text_models) == ["base", "x"]
    listed = {v.version: v for v in describe(store, "legacy", []).versions}
    assert listed[derived.version].components == ["legacy_index", "note"]
    assert listed[derived.version].text_encoders == ["base", "x"]


def test_a_component_of_the_wrong_type_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ComponentsInvalid) as wrong:
        Components.from_manifest({"weights": "model.safetensors", "text_encoders": 3})
    assert str(wrong.value) == "components.text_encoders: Input should be a valid dictionary (got 3)"
    with pytest.raises(ComponentsInvalid, match=r"components\.dcsm\.config: Field required"):
        Components.from_manifest({"dcsm": {"weights": "dcsm.safetensors"}})
    with pytest.raises(ComponentsInvalid, match=r"components\.weights_dtype: .* \(got 'bfloat16'\)"):
        Components.from_manifest({"weights_dtype": "bfloat16"})

    root = tmp_path / "store"
    store = ModelStore(root)
    _publish_with_variant(store)
    version = _edited_copy(root, lambda c: c.update(text_encoders=3))
    with pytest.raises(VersionInvalid, match=r"components\.text_encoders: Input should be a valid dictionary"):
        validate_version(store.manifest("m", version), store.version_dir("m", version))
    with pytest.raises(VersionRefused, match=r"components\.text_encoders"):
        ModelStore(root, validator=validate_version).promote("m", "production", version)
    # GET /models lists the version with the reason instead of failing the whole answer.
    listed = {v.version: v for v in describe(store, "m", []).versions}
    assert "components.text_encoders" in (listed[version].error or "") and listed["v1"].error is None


@pytest.mark.parametrize("weights", ["absent", None])
def test_a_version_without_weights_is_refused(tmp_path: Path, weights: str | None) -> None:
    root = tmp_path / "store"
    store = ModelStore(root)
    _publish_with_variant(store)
    version = _edited_copy(root, lambda c: c.pop("weights") if weights == "absent" else c.update(weights=None))
    with pytest.raises(VersionInvalid, match="components.weights is not set: the version holds no weights"):
        validate_version(store.manifest("m", version), store.version_dir("m", version))
