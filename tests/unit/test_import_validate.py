"""``clip-train import`` and the load check at publish, promote and verify, on tiny models.

Real files, real checkpoints in every format, real store; the architectures are tiny open_clip
configs (a CLIP and a SigLIP-style CustomTextCLIP) so each import builds and runs in well under a
second. The real-sized acceptance (ViT-B-32, MobileCLIP served over HTTP) is
tests/service/test_imported_models.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from clipcore.errors import ClipError, ErrorCode
from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import build_model, is_trainable_text_param, text_features
from clipcore.models.importing import ModelImportError, resolve_pretrained
from clipcore.models.validate import validate_version
from model_store import ChecksumMismatch, ModelStore, VersionRefused
from model_store.cli import app as store_app
from training.cli import app as train_app

TINY_CLIP = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
# SigLIP's shape (sigmoid logits with a bias, no causal mask, last-token pooling) at toy size,
# with open_clip's BPE vocabulary so its tokenizer needs nothing from the network.
TINY_SIGLIP = {
    "embed_dim": 32,
    "init_logit_bias": -10,
    "custom_text": True,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1,
                 "no_causal_mask": True, "pool_type": "last", "proj_bias": True},
}  # fmt: skip
HUB_PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "interpolation": "bilinear",
                  "resize_mode": "squash"}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _model(config: dict[str, Any], seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(config).eval()


def _arch_file(tmp_path: Path, config: dict[str, Any], name: str = "arch.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def _import(runner: CliRunner, store: Path, name: str, *args: str) -> Any:
    return runner.invoke(train_app, ["import", name, "--store", str(store), *args])


def _assert_same_weights(bundle: ModelBundle, model: torch.nn.Module) -> None:
    loaded = bundle.model.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize("fmt", ["pt-wrapped", "bin-module-prefix", "safetensors"])
def test_import_state_dict_in_each_format(runner: CliRunner, tmp_path: Path, fmt: str) -> None:
    model = _model(TINY_CLIP)
    state = model.state_dict()
    if fmt == "pt-wrapped":
        weights = tmp_path / "ckpt.pt"
        torch.save({"state_dict": state, "epoch": 3}, weights)
    elif fmt == "bin-module-prefix":
        weights = tmp_path / "ckpt.bin"
        torch.save({f"module.{k}": v for k, v in state.items()}, weights)
    else:
        weights = tmp_path / "ckpt.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, weights)
    store = tmp_path / "store"
    arch = _arch_file(tmp_path, TINY_CLIP)
    result = _import(runner, store, "mine", "--arch", str(arch), "--weights", str(weights))
    assert result.exit_code == 0, result.output
    assert "imported mine@v1" in result.output and "no alias" in result.output
    registry = ModelStore(store)
    assert registry.aliases("mine") == {}  # aliases only when asked
    bundle = ModelBundle.load(registry, "mine@v1")
    _assert_same_weights(bundle, model)
    manifest = bundle.manifest
    assert (manifest.image_size, manifest.embed_dim, manifest.context_length) == (32, 32, 16)
    assert manifest.tokenizer == "open_clip:bpe" and manifest.components["weights"] == "model.safetensors"
    source = manifest.training["imported_from"]
    assert source["kind"] == "weights" and source["file"] == weights.name and len(source["sha256"]) == 64
    assert str(tmp_path) not in manifest.to_json()  # no local paths in the manifest


def test_import_hub_folder_records_its_preprocessing_and_alias(runner: CliRunner, tmp_path: Path) -> None:
    model = _model(TINY_SIGLIP, seed=1)
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_SIGLIP, "preprocess_cfg": HUB_PREPROCESS}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, hub / "open_clip_model.safetensors")
    store = tmp_path / "store"
    result = _import(runner, store, "sig", "--hf-dir", str(hub), "--alias", "production", "--fp16")
    assert result.exit_code == 0, result.output
    registry = ModelStore(store)
    assert registry.aliases("sig") == {"production": "v1"}
    manifest = registry.manifest("sig", "v1")
    assert manifest.preprocess == HUB_PREPROCESS
    assert manifest.components["weights_dtype"] == "float16"
    stored = load_file(str(registry.file_path("sig", "v1", "model.safetensors")))
    assert stored["logit_bias"].dtype == torch.float16
    bundle = ModelBundle.load(registry, "sig")
    assert bundle.family == "custom_text" and bundle.logit_bias == pytest.approx(-10.0)
    # fp16 weights: the embeddings agree with the fp32 model's closely, not bit for bit.
    tokens = bundle.tokenize(["a red circle", "a blue square"])
    with torch.no_grad():
        full = torch.nn.functional.pad(tokens, (0, 16 - tokens.shape[1]))
        expected = torch.nn.functional.normalize(model.encode_text(full), dim=-1).numpy()
    cosine = (bundle.encode_texts(["a red circle", "a blue square"]) * expected).sum(-1)
    assert cosine.min() > 0.999


def test_hub_folder_without_weights_or_config_is_a_clear_error(runner: CliRunner, tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    hub.mkdir()
    result = _import(runner, tmp_path / "store", "x", "--hf-dir", str(hub))
    assert result.exit_code == 1 and "open_clip_config.json" in result.output
    (hub / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP}))
    result = _import(runner, tmp_path / "store", "x", "--hf-dir", str(hub))
    assert result.exit_code == 1
    assert "open_clip_model.safetensors" in result.output and "open_clip_pytorch_model.bin" in result.output


def test_weights_that_do_not_fit_the_architecture_are_refused(runner: CliRunner, tmp_path: Path) -> None:
    weights = tmp_path / "other.safetensors"
    save_file({k: v.contiguous() for k, v in _model(TINY_SIGLIP).state_dict().items()}, weights)
    result = _import(runner, tmp_path / "store", "x", "--arch", str(_arch_file(tmp_path, TINY_CLIP)),
                     "--weights", str(weights))  # fmt: skip
    assert result.exit_code == 1 and "do not fit the architecture" in result.output
    assert not (tmp_path / "store" / "x" / "versions").exists()


def test_weights_of_another_patch_size_name_the_tensors_that_differ(runner: CliRunner, tmp_path: Path) -> None:
    """ViT-B-32 weights imported as ViT-B-16 said "... for CLIP:" and nothing after the colon."""
    weights = tmp_path / "b32.safetensors"
    save_file({k: v.contiguous() for k, v in _model(TINY_CLIP).state_dict().items()}, weights)
    patch16 = {**TINY_CLIP, "vision_cfg": {**TINY_CLIP["vision_cfg"], "patch_size": 4}}
    result = _import(runner, tmp_path / "store", "x", "--arch", str(_arch_file(tmp_path, patch16)),
                     "--weights", str(weights))  # fmt: skip
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "tensor(s) differ in shape (visual." in output, output
    assert "check that --arch (or the config) is the one the checkpoint was trained with" in output


def test_a_state_dict_mismatch_is_summarised_in_one_line() -> None:
    from clipcore.models.importing import state_dict_mismatch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 5))
    other = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(4, 5), torch.nn.Linear(1, 1)).state_dict()
    del other["1.bias"]
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(other, strict=True)
    summary = state_dict_mismatch(str(info.value))
    assert summary == (
        "2 tensor(s) differ in shape (0.weight: [5, 3] in the checkpoint, [4, 3] in the architecture and 1 more); "
        "1 missing from the checkpoint (1.bias); 2 in the checkpoint but not the architecture (2.weight, ...)"
    )


def test_a_store_path_whose_parent_is_missing_is_refused(runner: CliRunner, tmp_path: Path) -> None:
    """`--store /typo/path` created a store nobody serves and imported into it."""
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in _model(TINY_CLIP).state_dict().items()}, weights)
    typo = tmp_path / "typo" / "path"
    result = _import(runner, typo, "x", "--arch", str(_arch_file(tmp_path, TINY_CLIP)), "--weights", str(weights))
    assert result.exit_code == 1 and "neither this folder nor" in " ".join(result.output.split())
    assert not typo.exists() and not typo.parent.exists()


def test_preprocessing_the_service_cannot_apply_is_refused_before_import(runner: CliRunner, tmp_path: Path) -> None:
    hub = tmp_path / "hub"  # a hub folder whose own preprocessing has two std values
    hub.mkdir()
    config = {"model_cfg": TINY_CLIP, "preprocess_cfg": {**HUB_PREPROCESS, "std": [0.5, 0.5]}}
    (hub / "open_clip_config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in _model(TINY_CLIP).state_dict().items()}
    save_file(state, hub / "open_clip_model.safetensors")
    for extra, expected in ((["--interpolation", "lanczos", "--std", "0.5,0.5,0.5"], "unknown interpolation 'lanczos'"),
                            ([], "three values each")):  # fmt: skip
        result = _import(runner, tmp_path / "store", "x", "--hf-dir", str(hub), *extra)
        assert result.exit_code == 1 and "preprocessing" in result.output and expected in result.output, result.output
        assert isinstance(result.exception, SystemExit)  # an error line, not a traceback
    assert not (tmp_path / "store" / "x").exists()


def test_unknown_architecture_name_suggests_close_ones(runner: CliRunner, tmp_path: Path) -> None:
    result = _import(runner, tmp_path / "store", "x", "--arch", "ViT-B-33", "--weights", str(tmp_path / "w.pt"))
    assert result.exit_code == 1 and "no model config named 'ViT-B-33'" in result.output and "ViT-B-32" in result.output


def test_pretrained_tag_missing_from_the_caches_names_what_was_looked_for(runner: CliRunner, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = _import(runner, tmp_path / "store", "x", "--arch", "ViT-B-32", "--pretrained", "openai",
                     "--cache-dir", str(cache))  # fmt: skip
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "not in the local caches" in out and "--allow-download" in out
    assert "ViT-B-32.pt" in out and str(cache) in out  # the file and the folder
    assert "open_clip_pytorch_model.bin" in out and "vit_base_patch32_clip_224.openai" in out
    result = _import(runner, tmp_path / "store", "x", "--arch", "ViT-B-32", "--pretrained", "nonesuch")
    assert result.exit_code == 1 and "known: " in result.output and "openai" in result.output


def test_pretrained_tag_is_found_in_a_hugging_face_cache(tmp_path: Path) -> None:
    # The layout huggingface_hub writes: refs/main names the snapshot that holds the file.
    repo = tmp_path / "models--apple--MobileCLIP-S1-OpenCLIP"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "open_clip_model.safetensors").write_bytes(b"placeholder")
    path, cfg = resolve_pretrained("MobileCLIP-S1", "datacompdr", tmp_path, allow_download=False)
    assert path == snapshot / "open_clip_model.safetensors"
    assert cfg["interpolation"] == "bilinear" and tuple(cfg["mean"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ModelImportError, match="MobileCLIP-S1-OpenCLIP"):
        resolve_pretrained("MobileCLIP-S1", "datacompdr", tmp_path / "empty", allow_download=False)


# ----------------------------------------------------------------------------- the load check
def _publish_tiny(store: ModelStore, name: str = "m", **fields: Any) -> str:
    from clipcore.models.publish import TrainedModel, publish_bundle

    manifest = publish_bundle(store, name, TrainedModel(_model(TINY_CLIP), TINY_CLIP, fp16=False))  # type: ignore[arg-type]
    return manifest.version


def _hand_edited_version(root: Path, name: str, edit: Any, version: str = "v2") -> str:
    """Copy v1 to a new version whose manifest is edited by hand, as a user could."""
    src, dst = root / name / "versions" / "v1", root / name / "versions" / version
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    edit(manifest, dst)
    manifest["version"] = version
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return version


BROKEN = {
    "wrong width": (lambda m, d: m.update(embed_dim=48), "embed_dim is 48"),
    "wrong image size": (lambda m, d: m.update(image_size=64), "image_size is 64 but the architecture takes 32 px"),
    "missing file": (lambda m, d: (d / "model.safetensors").unlink(), "model.safetensors (missing)"),
    "weights outside the store": (
        lambda m, d: m["architecture"].update(pretrained="/data/ckpt/model.pt"),
        "loads weights from outside the store",
    ),
    "download tag": (
        lambda m, d: m["architecture"].update(pretrained="openai"),
        "'openai' loads weights from outside the store",
    ),
    "component outside the version": (
        lambda m, d: m["components"].update(weights="/data/model.safetensors"),
        "is outside the version",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_versions_are_refused_at_promote(tmp_path: Path, case: str) -> None:
    root = tmp_path / "store"
    store = ModelStore(root, validator=validate_version)
    _publish_tiny(store)
    edit, reason = BROKEN[case]
    version = _hand_edited_version(root, "m", edit)
    with pytest.raises((VersionRefused, ChecksumMismatch)) as refused:
        store.promote("m", "production", version)
    assert reason in str(refused.value)
    assert store.aliases("m") == {}


def _fields() -> dict[str, Any]:
    return {
        "architecture": dict(TINY_CLIP),
        "context_length": 16,
        "embed_dim": 32,
        "image_size": 32,
        "preprocess": {},
        "components": {"weights": "model.safetensors"},
    }


@pytest.mark.parametrize("case", ["wrong width", "wrong image size", "weights outside the store"])
def test_broken_manifests_are_refused_at_publish(tmp_path: Path, case: str) -> None:
    store = ModelStore(tmp_path / "store", validator=validate_version)
    good = _model(TINY_CLIP)
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in good.state_dict().items()}, weights)
    fields = _fields()
    edit, reason = BROKEN[case]
    edit(fields, tmp_path)
    with pytest.raises(VersionRefused) as refused:
        store.publish("m", {"model.safetensors": weights}, fields, aliases=["production"])
    assert reason in str(refused.value) and "refusing m@" in str(refused.value)
    assert not (tmp_path / "store" / "m" / "versions").exists() or store.list_versions("m") == []


def test_publish_refuses_a_file_the_manifest_names_but_does_not_carry(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")  # no validator: the store's own manifest check
    fields = _fields()
    with pytest.raises(VersionRefused, match="'model.safetensors' is not among the version's files"):
        store.publish("m", {"other.bin": b"x"}, fields)


def test_model_store_cli_runs_the_installed_load_check(runner: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "store"
    _publish_tiny(ModelStore(root))
    _hand_edited_version(root, "m", BROKEN["wrong width"][0])
    _hand_edited_version(root, "m", BROKEN["download tag"][0], version="v3")
    ok = runner.invoke(store_app, ["--store", str(root), "verify", "m@v1"])
    assert ok.exit_code == 0 and "loads and runs" in ok.output, ok.output
    for ref, reason in (("m@v2", "embed_dim is 48"), ("m@v3", "'openai' loads weights from outside the store")):
        refused = runner.invoke(store_app, ["--store", str(root), "promote", ref])
        assert refused.exit_code == 1 and reason in " ".join(refused.output.split()), refused.output
        failed = runner.invoke(store_app, ["--store", str(root), "verify", ref])
        assert failed.exit_code == 1 and reason in " ".join(failed.output.split()), failed.output
    assert runner.invoke(store_app, ["--store", str(root), "promote", "m@v1"]).exit_code == 0
    assert ModelStore(root).aliases("m") == {"production": "v1"}


def test_validate_version_refuses_a_version_without_weights(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    _publish_tiny(store)
    manifest = store.manifest("m", "v1")
    without = manifest.model_copy(update={"components": {}})
    with pytest.raises(ValueError, match="holds no weights"):
        validate_version(without, store.version_dir("m", "v1"))


# ----------------------------------------------------------------------------- families
def test_custom_text_towers_refuse_per_token_features_with_a_clear_code() -> None:
    from service.api.errors import STATUS

    model = _model(TINY_SIGLIP)
    tokens = torch.zeros(2, 16, dtype=torch.long)
    with pytest.raises(ClipError) as dense:
        text_features(model, tokens, dense=True)  # type: ignore[arg-type]
    assert dense.value.code == ErrorCode.unsupported_for_family and "CustomTextCLIP" in dense.value.message
    assert STATUS[dense.value.code] == 400
    pooled, _ = text_features(model, tokens[:, :5])  # type: ignore[arg-type]
    with torch.no_grad():
        assert torch.allclose(pooled, model.encode_text(tokens))  # trimmed tokens padded back


def test_text_finetunes_know_each_family_text_tower() -> None:
    for config in (TINY_CLIP, TINY_SIGLIP):
        model = _model(config)
        trainable = {n for n, _ in model.named_parameters() if is_trainable_text_param(n)}
        assert trainable and not any(n.startswith("visual.") or "token_embedding" in n for n in trainable)
        assert any("transformer.resblocks.0" in n for n in trainable)
    assert is_trainable_text_param("text.ln_final.weight") and not is_trainable_text_param("text_decoder.x")


def test_text_variant_of_a_custom_text_model_round_trips(tmp_path: Path) -> None:
    from clipcore.models.publish import TrainedModel, publish_bundle

    model = _model(TINY_SIGLIP)
    variant = {k: v + 0.01 if is_trainable_text_param(k) else v for k, v in model.state_dict().items()}
    store = ModelStore(tmp_path / "store", validator=validate_version)
    publish_bundle(store, "s", TrainedModel(model, TINY_SIGLIP, text_variants={"pcclip": variant}, fp16=False))  # type: ignore[arg-type]
    bundle = ModelBundle.load(store, "s@v1")
    base, tuned = bundle.encode_texts(["a cat"], "base"), bundle.encode_texts(["a cat"], "pcclip")
    assert not np.allclose(base, tuned) and bundle.text_models["pcclip"].visual is bundle.model.visual


def test_allowed_download_that_cannot_happen_is_a_clear_error(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hugging Face's own offline switch (HF_HUB_OFFLINE, read when the library is imported): the
    # download is really attempted and refused by the library, without any network traffic.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    result = _import(runner, tmp_path / "store", "x", "--arch", "MobileCLIP-S1", "--pretrained", "datacompdr",
                     "--cache-dir", str(tmp_path / "cache"), "--allow-download")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "downloading the weights of MobileCLIP-S1 'datacompdr' failed" in " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)
