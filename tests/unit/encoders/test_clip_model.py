"""Model factory, hooks, trimmed text encoding, dense features, store round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import ConvStem, build_model, image_features, text_features, tokenizer_for, trimmed
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore

CONFIG = json.loads((Path(__file__).parents[3] / "training/configs/shapes-smoke.json").read_text())


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(CONFIG).eval()


def test_conv_stem_hook_replaces_patch_embedding(model) -> None:
    assert isinstance(model.visual.conv1, ConvStem)
    with pytest.raises(KeyError):
        build_model({**CONFIG, "hooks": ["no-such-hook"]})


def test_trimmed_text_features_equal_full_length(model) -> None:
    tokens = tokenizer_for(32)(["a red circle", "a photo of a small blue square to the left of a cross."])
    with torch.no_grad():
        full, _ = text_features(model, tokens)
        short, dense = text_features(model, trimmed(tokens), dense=True)
        reference = model.encode_text(tokens)
    assert trimmed(tokens).shape[1] < 32
    torch.testing.assert_close(full, short, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full, reference, atol=1e-5, rtol=1e-5)
    assert dense is not None and dense.shape[:2] == trimmed(tokens).shape


def test_dense_image_features_pool_to_the_class_token(model) -> None:
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        pooled, tokens = image_features(model, x, dense=True)
        plain, _ = image_features(model, x)
    assert tokens is not None and tokens.shape == (2, 1 + 64, CONFIG["embed_dim"])
    torch.testing.assert_close(pooled, plain, atol=1e-5, rtol=1e-5)


def test_publish_and_load_bundle_with_a_text_variant(tmp_path: Path, model) -> None:
    variant = {k: (v + 0.01 if k.startswith("transformer.") else v) for k, v in model.state_dict().items()}
    store = ModelStore(tmp_path)
    manifest = publish_bundle(
        store,
        "tiny",
        TrainedModel(model, CONFIG, text_variants={"pcclip": variant}, default_text_encoder="pcclip", fp16=False),
        aliases=["production"],
    )
    assert set(manifest.files) == {"model.safetensors", "text_pcclip.safetensors"}
    bundle = ModelBundle.load(store, "tiny@production")
    assert bundle.ref == "tiny@v1" and bundle.default_text_encoder == "pcclip"
    assert bundle.text_models["pcclip"].visual is bundle.model.visual
    texts = ["a red circle", "a blue square"]
    base = bundle.encode_texts(texts, "base")
    with torch.no_grad():
        expected = torch.nn.functional.normalize(model.encode_text(tokenizer_for(32)(texts)), dim=-1).numpy()
    np.testing.assert_allclose(base, expected, atol=1e-5)
    assert np.abs(bundle.encode_texts(texts, "pcclip") - base).max() > 1e-3
    long, short = "word " * 40, "short"
    tokens = bundle.tokenize([long, short])
    assert [bundle.text_truncated(t) for t in (long, short)] == [True, False]
    assert tokens.shape == (2, 32) and tokens[0, -1] == tokenizer_for(32).eot_token_id  # cut, closed by the end token
    with pytest.raises(KeyError):
        bundle.text_model("semclip")


def test_preprocessing_is_read_once_with_openai_defaults() -> None:
    from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig

    assert PreprocessConfig.from_manifest({}) == PreprocessConfig(OPENAI_MEAN, OPENAI_STD, "bicubic", "shortest")
    recorded = {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.25, 0.25, 0.25],
        "interpolation": "bilinear",
        "resize_mode": "squash",
    }
    config = PreprocessConfig.from_manifest(recorded)
    assert config.mean == (0.5, 0.5, 0.5) and config.interpolation == "bilinear"
    assert config.to_manifest() == recorded


def test_dense_image_features_come_from_the_public_intermediates_unchanged() -> None:
    import json
    from pathlib import Path

    import torch

    from clipcore.models.clip_model import build_model, image_features

    config = Path(__file__).resolve().parents[3] / "training" / "configs" / "shapes-smoke.json"
    torch.manual_seed(0)
    model = build_model(json.loads(config.read_text())).eval()
    images = torch.randn(3, 3, model.visual.image_size[0], model.visual.image_size[0])
    with torch.no_grad():
        pooled, tokens = image_features(model, images, dense=True)
        visual = model.visual  # the computation as written against open_clip's internals before
        x = visual.ln_post(visual.transformer(visual._embeds(images)))
        reference = x @ visual.proj
        assert tokens is not None and torch.equal(tokens, reference)
        # The same pass's pooled output is the pooled forward's (/embed's), and here (class-token
        # pooling) the class token's row within float rounding.
        assert torch.equal(pooled, image_features(model, images)[0])
        assert torch.allclose(pooled, reference[:, 0], atol=1e-5)


def test_dense_functional_rows_are_memoised_by_token_ids_in_bounded_memory(
    model, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random
    import string

    from clipcore.models import dense

    monkeypatch.setattr(dense, "ROW_CACHE_SIZE", 64)
    enc = dense.DenseEncoder(model, 32)
    rng = random.Random(0)
    # Long unique texts, as a server sees them: the memo must keep token ids, never the texts.
    texts = [f"a red circle above a cube {''.join(rng.choices(string.ascii_lowercase, k=1500))}" for _ in range(200)]
    for start in range(0, len(texts), 50):
        features = enc.text_features(texts[start : start + 50])
    assert len(enc._rows) == 64
    assert all(isinstance(key, tuple) and len(key) <= 32 for key in enc._rows)
    # Rows follow the ids: "above" is a functional word, found again on a memo hit.
    rows, words = enc.functional_rows(next(reversed(enc._rows)))
    assert words == ["above"] and features.words[-1] == ["above"]
    assert rows == features.row_index[-1].tolist()
