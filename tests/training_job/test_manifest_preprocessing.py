"""Training encodes images as serving does, with the version's own preprocessing: an imported model
whose manifest has other statistics than OpenAI CLIP's (mean, std, interpolation, resize mode) is
trained on images resized and normalised as its manifest says, for the user-data commands and the
shapes-world stages alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import build_model
from clipcore.models.dense import DenseEncoder
from clipcore.models.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig, fit_square, upright
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from training.recipe import model_config
from training.userdata.context import RunContext
from training.userdata.demo_data import write_user_dataset

# Not OpenAI CLIP's values in any field.
OTHER = PreprocessConfig(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), interpolation="bilinear", resize_mode="squash")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("preprocess")
    store = ModelStore(root / "models")
    torch.manual_seed(0)
    config = model_config("shapes-smoke")
    publish_bundle(store, "other", TrainedModel(build_model(config), config, preprocess=OTHER), aliases=["production"])
    data = write_user_dataset(root / "data", per_label=3, scenes=4)
    # Wide pictures, as photos are: the 64 px model squashes them (a centre crop by default).
    for path in (data / "images").iterdir():
        with Image.open(path) as img:
            wide = img.convert("RGB").resize((136, 72), Image.Resampling.BICUBIC)
        wide.save(path, format="PNG" if path.suffix == ".png" else "JPEG")
    return store, data


def test_user_data_features_are_those_serving_computes(imported: tuple[ModelStore, Path], tmp_path: Path) -> None:
    store, data = imported
    ctx = RunContext.open(store, "other@production", data, run_dir=tmp_path / "run", cache_dir=tmp_path / "features",
                          log=lambda _: None)  # fmt: skip
    bundle = ModelBundle.load(store, "other@production")
    assert (bundle.mean, bundle.std) == (OTHER.mean, OTHER.std)
    refs = [item.images[0] for item in ctx.dataset.of_kind("label")]
    served = bundle.encode_images(np.stack([bundle.preprocess(upright(Image.open(r.path))) for r in refs]))  # type: ignore[arg-type]
    np.testing.assert_allclose(ctx.features.of("pooled", refs), served, atol=1e-5)

    # The test has teeth: OpenAI's statistics or the default resize give other features.
    default = np.stack([fit_square(upright(Image.open(r.path)), bundle.image_size) for r in refs])  # type: ignore[arg-type]
    assert np.abs(bundle.encode_images(default) - served).max() > 1e-3  # 100x the tolerance above
    openai = ModelBundle.load(store, "other@production")
    openai.manifest = openai.manifest.model_copy(
        update={"preprocess": {**OTHER.to_manifest(), "mean": list(OPENAI_MEAN), "std": list(OPENAI_STD)}}
    )
    pixels = np.stack([bundle.preprocess(upright(Image.open(r.path))) for r in refs])  # type: ignore[arg-type]
    assert np.abs(openai.encode_images(pixels) - served).max() > 1e-3  # 100x the tolerance above


def test_shapes_world_stages_encode_with_the_base_versions_preprocessing(
    imported: tuple[ModelStore, Path],
) -> None:
    from training.encode import encode_image_tokens, encode_images
    from training.train_pcclip import PCClipConfig, difference_dataset
    from training.world.render import render_batch
    from training.world.scene import Split, sample_scene

    store, _ = imported
    bundle = ModelBundle.load(store, "other@production")
    pixels = render_batch([sample_scene(Split.TEST, 0, i) for i in range(6)], bundle.image_size, seed=None)
    pre = bundle.preprocess_config
    np.testing.assert_allclose(encode_images(bundle.model, pre, pixels).numpy(), bundle.encode_images(pixels),
                               atol=1e-6)  # fmt: skip
    # YUKINO's and DCSM's input: the class + patch tokens serving's dense path gives.
    expected = DenseEncoder(bundle.model, bundle.context_length, mean=bundle.mean, std=bundle.std).image_tokens(pixels)
    torch.testing.assert_close(encode_image_tokens(bundle.model, pre, pixels), expected, rtol=0, atol=0)
    # A stage's frozen image features are the version's: PC-CLIP's pair embeddings, for one.
    data = difference_dataset(PCClipConfig(pairs=4), bundle.model, pre)
    assert data["g1"].shape == (4, bundle.embed_dim)
    with pytest.raises(TypeError):
        difference_dataset(PCClipConfig(pairs=4), bundle.model)  # type: ignore[call-arg]  # no default statistics
