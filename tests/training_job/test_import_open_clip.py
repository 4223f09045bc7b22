"""``clip-train import-open-clip``: a pretrained open_clip checkpoint becomes a store version that
embeds as the original model does; a missing checkpoint is a clear error, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import torch
from typer.testing import CliRunner

from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from training.cli import app

TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def test_a_checkpoint_is_published_and_embeds_like_the_original(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = tmp_path / "tiny-import-test.json"
    config.write_text(json.dumps(TINY))
    open_clip.add_model_config(config)
    original = open_clip.create_model("tiny-import-test").eval()
    checkpoint = tmp_path / "weights.pt"
    torch.save(original.state_dict(), checkpoint)

    store = tmp_path / "store"
    args = ["import-open-clip", "mine", "--arch", str(config), "--pretrained", str(checkpoint), "--store", str(store)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "published mine@v1" in result.output
    manifest = ModelStore(store).manifest("mine", "v1")
    assert manifest.training["method"] == "import" and manifest.image_size == 32

    bundle = ModelBundle.load(ModelStore(store), "mine@production")
    texts = ["a photo of a coat", "a photo of a shirt"]
    with torch.no_grad():
        expected = original.encode_text(open_clip.tokenize(texts, context_length=16), normalize=True).numpy()
        pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
        x = (torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255 - torch.tensor(bundle.mean)[:, None, None]) / (
            torch.tensor(bundle.std)[:, None, None]
        )
        expected_images = original.encode_image(x, normalize=True).numpy()
    # Weights are stored as float16: embeddings agree to that precision.
    np.testing.assert_allclose(bundle.encode_texts(texts), expected, atol=5e-3)
    np.testing.assert_allclose(bundle.encode_images(pixels), expected_images, atol=5e-3)


def test_a_missing_checkpoint_or_architecture_is_reported(tmp_path: Path) -> None:
    store, config = tmp_path / "store", tmp_path / "tiny-import-test.json"
    config.write_text(json.dumps(TINY))
    missing = CliRunner().invoke(app, ["import-open-clip", "mine", "--arch", str(config), "--pretrained",
                                       str(tmp_path / "nowhere.pt"), "--store", str(store)])  # fmt: skip
    assert missing.exit_code == 1 and "cannot load tiny-import-test weights" in " ".join(missing.output.split())
    unknown = CliRunner().invoke(app, ["import-open-clip", "mine", "--arch", "ViT-Q-99", "--pretrained", "x",
                                       "--store", str(store)])  # fmt: skip
    assert unknown.exit_code == 1 and "unknown open_clip architecture" in unknown.output
    assert not (store / "mine").exists()
