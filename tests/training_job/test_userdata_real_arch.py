"""A real open_clip architecture (ViT-B-32, random weights: no pretrained weights can be
downloaded here) runs ``pcclip`` and ``dcsm`` on user data at its own 224 px for a few steps on
CPU, each publishing a version the service's loader accepts. Speed is recorded in
docs/benchmarks-notebook.md (``python -m training.userdata.bench``), not asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import build_model
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from training.recipe import model_config
from training.userdata.context import RunContext
from training.userdata.dcsm import DCSMRun, run_dcsm
from training.userdata.demo_data import write_user_dataset
from training.userdata.pcclip import PCClipRun, run_pcclip

pytestmark = pytest.mark.slow


def test_vit_b_32_runs_pcclip_and_dcsm_on_user_data(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = model_config("ViT-B-32")
    torch.manual_seed(0)
    store = ModelStore(tmp_path / "store")
    publish_bundle(store, "vitb32", TrainedModel(build_model(config), config), aliases=["production"])
    data = write_user_dataset(tmp_path / "data", per_label=3, scenes=4, size=160)  # resized to 224 on the way in

    def ctx(model: str) -> RunContext:
        return RunContext.open(store, model, data, run_dir=tmp_path / "run", cache_dir=tmp_path / "features",
                               log=lambda _: None)  # fmt: skip

    first = ctx("vitb32@production")
    pcclip = run_pcclip(first, PCClipRun(steps=2, batch_size=4, generated_pairs=8))
    assert pcclip is not None
    second = ctx(pcclip.ref)
    second.features.of("pooled", list(first.features.images.refs.values()))
    assert second.features.cache.computed == {"pooled": 0}  # pcclip's version shares the base's features
    dcsm = run_dcsm(second, DCSMRun(steps=2, batch_size=4, channels=8, hidden=16))
    assert dcsm is not None
    bundle = ModelBundle.load(store, dcsm.ref)
    assert bundle.image_size == 224 and set(bundle.text_models) == {"base", "pcclip"}
    assert bundle.dcsm is not None and bundle.dcsm.config["grid"] == 7  # 224 / 32
