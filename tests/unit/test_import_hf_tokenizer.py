"""Architectures that tokenize with a Hugging Face tokenizer (``hf_tokenizer_name``): the tokenizer
folder is found (``--tokenizer-dir``, the hub folder, the local Hugging Face cache), copied into the
version, checksummed and loaded offline; without it the import and the load check say what is missing.

Real files: a toy word-level tokenizer saved with ``save_pretrained``, a toy SigLIP-shaped model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_word_tokenizer import HF_VOCAB, save_word_tokenizer
from safetensors.torch import save_file
from typer.testing import CliRunner

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import build_model
from clipcore.models.validate import validate_version
from model_store import ChecksumMismatch, ModelStore, VersionRefused
from training.cli import app as train_app

pytest.importorskip("transformers")

TOKENIZER_NAME = "example/tiny-word-tokenizer"
CONFIG: dict[str, Any] = {
    "embed_dim": 32,
    "init_logit_bias": -10,
    "custom_text": True,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": len(HF_VOCAB), "width": 32, "heads": 2, "layers": 1,
                 "no_causal_mask": True, "pool_type": "last", "proj_bias": True,
                 "hf_tokenizer_name": TOKENIZER_NAME, "tokenizer_kwargs": {"clean": "canonicalize"}},
}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    torch.manual_seed(0)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(CONFIG).state_dict().items()}, weights)
    arch = tmp_path / "arch.json"
    arch.write_text(json.dumps(CONFIG))
    return {"weights": weights, "arch": arch, "store": tmp_path / "store"}


def _import(files: dict[str, Path], *args: str) -> Any:
    base = ["import", "s", "--store", str(files["store"]), "--arch", str(files["arch"]), "--weights"]
    return CliRunner(env={"COLUMNS": "200"}).invoke(train_app, [*base, str(files["weights"]), *args])


def test_import_with_a_tokenizer_folder_serves_its_ids(files: dict[str, Path], tmp_path: Path) -> None:
    from open_clip.tokenizer import HFTokenizer

    tokenizer = save_word_tokenizer(tmp_path / "tok")
    result = _import(files, "--tokenizer-dir", str(tokenizer))
    assert result.exit_code == 0, result.output
    store = ModelStore(files["store"])
    manifest = store.manifest("s", "v1")
    assert manifest.tokenizer == "hf:tokenizer"
    assert {"tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"} <= set(manifest.files)
    bundle = ModelBundle.load(store, "s@v1")
    texts = ["A  red   circle", "the first is red, while the second is blue"]
    tokens = bundle.tokenize(texts)
    expected = HFTokenizer(str(tokenizer), context_length=16, clean="canonicalize")(texts)
    assert torch.equal(tokens, expected) and not any(bundle.text_truncated(t) for t in texts)
    words = [HF_VOCAB.index(w) for w in ("a", "red", "circle", "</s>")]  # lower-cased; pad to the context
    assert tokens.shape == (2, 16) and tokens[0].tolist() == words + [0] * 12
    assert bundle.text_truncated(" ".join(["red"] * 16)) and not bundle.text_truncated(" ".join(["red"] * 15))
    # Usage counts (/v1/embeddings) are this tokenizer's: three words and the end token; capped.
    assert bundle.token_count(texts[0]) == 4 and bundle.token_count(" ".join(["red"] * 40)) == 16
    # The tokenizer is part of the version: changed bytes fail verification like changed weights.
    path = store.file_path("s", "v1", "tokenizer/tokenizer.json")
    path.write_text(path.read_text().replace('"circle"', '"square"', 1))
    with pytest.raises(ChecksumMismatch, match="tokenizer/tokenizer.json"):
        store.load_verified("s", "v1")


def test_tokenizer_is_found_in_the_hugging_face_cache(files: dict[str, Path], tmp_path: Path) -> None:
    repo = tmp_path / "hf" / f"models--{TOKENIZER_NAME.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc")
    save_word_tokenizer(repo / "snapshots" / "abc")
    result = _import(files, "--cache-dir", str(tmp_path / "hf"))
    assert result.exit_code == 0, result.output
    assert ModelStore(files["store"]).manifest("s", "v1").tokenizer == "hf:tokenizer"


def test_missing_tokenizer_names_where_it_looked(files: dict[str, Path], tmp_path: Path) -> None:
    result = _import(files, "--cache-dir", str(tmp_path / "empty"))
    out = " ".join(result.output.split())
    assert result.exit_code == 1
    assert f"Hugging Face tokenizer '{TOKENIZER_NAME}'" in out and "--tokenizer-dir" in out
    assert str(tmp_path / "empty" / "models--example--tiny-word-tokenizer") in out
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    result = _import(files, "--tokenizer-dir", str(empty))
    assert result.exit_code == 1 and "holds no saved tokenizer" in result.output


def _fields(tokenizer: str, vocab: int = len(HF_VOCAB)) -> dict[str, Any]:
    config = {**CONFIG, "text_cfg": {**CONFIG["text_cfg"], "vocab_size": vocab}}
    return {"architecture": config, "context_length": 16, "embed_dim": 32, "image_size": 32, "preprocess": {},
            "components": {"weights": "model.safetensors"}, "tokenizer": tokenizer}  # fmt: skip


def test_load_check_refuses_a_version_without_its_tokenizer_or_with_a_larger_one(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", validator=validate_version)
    tokenizer = save_word_tokenizer(tmp_path / "tok")
    tok_files: dict[str, Any] = {f"tokenizer/{p.name}": p for p in tokenizer.iterdir()}
    torch.manual_seed(0)
    small = build_model({**CONFIG, "text_cfg": {**CONFIG["text_cfg"], "vocab_size": 8}})
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, weights)
    with pytest.raises(VersionRefused, match="unknown tokenizer 'sentencepiece'"):
        store.publish("s", {"model.safetensors": weights}, _fields("sentencepiece", vocab=8))
    with pytest.raises(VersionRefused, match="holds no tokenizer"):
        store.publish("s", {"model.safetensors": weights}, _fields("open_clip:bpe", vocab=8))
    with pytest.raises(VersionRefused, match="no files under tokenizer/"):
        store.publish("s", {"model.safetensors": weights}, _fields("hf:tokenizer", vocab=8))
    with pytest.raises(VersionRefused, match=f"the tokenizer has {len(HF_VOCAB)} tokens but the text tower embeds 8"):
        store.publish("s", {"model.safetensors": weights, **tok_files}, _fields("hf:tokenizer", vocab=8))
    assert store.list_versions("s") == []


def test_tokenizer_dir_is_refused_for_a_bpe_architecture(files: dict[str, Path], tmp_path: Path) -> None:
    bpe = {**CONFIG, "text_cfg": {k: v for k, v in CONFIG["text_cfg"].items() if k != "hf_tokenizer_name"}}
    files["arch"].write_text(json.dumps(bpe))
    result = _import(files, "--tokenizer-dir", str(save_word_tokenizer(tmp_path / "tok")))
    assert result.exit_code == 1 and "open_clip's BPE" in result.output
