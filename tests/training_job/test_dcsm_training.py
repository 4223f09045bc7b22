"""End to end on the tiny smoke model: feature cache, scorer training, files, evaluation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from clipcore.methods.dcsm import FUNCTIONAL_GROUPS
from clipcore.models.clip_model import build_model
from clipcore.models.components import Components
from clipcore.models.dense import DCSMHead, dcsm_component, dcsm_files
from clipcore.models.preprocess import PreprocessConfig
from training.evaluation.world.dcsm import dense_metrics
from training.train_dcsm import DCSMTrainConfig, train_dcsm

SMOKE = Path(__file__).resolve().parents[2] / "training" / "configs" / "shapes-smoke.json"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Small tensors on a shared CPU: one thread avoids OpenMP threads waiting on each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model(one_thread):
    torch.manual_seed(0)
    return build_model(json.loads(SMOKE.read_text())).eval()


def tiny_config(**kw) -> DCSMTrainConfig:
    return DCSMTrainConfig(samples=96, epochs=2, batch_size=32, val_samples=32, warmup_steps=2, encode_batch=128,
                           scorer={"channels": 8, "hidden": 32}, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def trained(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("dcsm")
    t0 = time.time()
    result = train_dcsm(model, 32, tiny_config(), out_dir=out, log=lambda _: None, preprocess=PreprocessConfig())
    return result, out, time.time() - t0


def test_train_dcsm_end_to_end_is_fast_and_complete(trained) -> None:
    (state, config, table), out, seconds = trained
    assert seconds < 30
    assert config["channels"] == 8 and config["grid"] == 8 and config["length"] == 30
    assert list(config["functional_groups"]) == list(FUNCTIONAL_GROUPS)
    assert table.shape == (8, 65)
    history = json.loads((out / "dcsm_history.json").read_text())
    assert [h["epoch"] for h in history["history"]] == [1, 2]
    assert set(history["history"][-1]["val"]) >= {"binding", "spatial_lr", "spatial_ab", "negation", "all"}
    assert all(torch.isfinite(v).all() for v in state.values())


def test_files_rebuild_the_same_scorer(trained) -> None:
    (state, config, table), _, _ = trained
    files = dcsm_files(state, config, table)
    assert set(files) == {"dcsm.safetensors"}  # the config is in the manifest, not a file nobody reads
    assert torch.equal(load(files["dcsm.safetensors"])["functional_table"], table)
    head = DCSMHead.from_bytes(files["dcsm.safetensors"], dcsm_component(config)["config"])
    maps = torch.randn(3, 30, 65)
    reference = DCSMHead.from_state({**{f"scorer.{k}": v for k, v in state.items()}, "functional_table": table}, config)
    assert torch.allclose(head.scorer(maps), reference.scorer(maps))
    assert dcsm_component(config) == {"weights": "dcsm.safetensors", "config": config}


def test_head_loads_from_a_version_directory(trained, tmp_path: Path) -> None:
    (state, config, table), _, _ = trained
    for name, data in dcsm_files(state, config, table).items():
        (tmp_path / name).write_bytes(data)
    head = DCSMHead.from_components(tmp_path, Components.from_manifest({"dcsm": dcsm_component(config)}))
    assert head is not None and torch.equal(head.table, table) and head.config["channels"] == 8
    assert DCSMHead.from_components(tmp_path, Components()) is None


def test_training_resumes_from_its_checkpoint(model, trained) -> None:
    (state, _, _), out, _ = trained
    logs: list[str] = []
    again, _, _ = train_dcsm(model, 32, tiny_config(), out_dir=out, log=logs.append, preprocess=PreprocessConfig())
    assert any(line.startswith("dcsm: resumed from step") for line in logs)
    assert all(torch.equal(state[k], again[k]) for k in state)


def test_dense_metrics_keys_and_ranges(model, trained) -> None:
    (state, config, table), _, _ = trained
    head = DCSMHead.from_bytes(dcsm_files(state, config, table)["dcsm.safetensors"], config)
    pre = PreprocessConfig()  # what a from-scratch model is published with
    metrics = dense_metrics(model, head, seed=0, n=6, mean=pre.mean, std=pre.std)
    for method in ("dcsm", "cosine"):
        for prefix in ("", "heldout.", "pil."):
            for kind in ("binding", "spatial_lr", "spatial_ab", "spatial", "negation"):
                assert 0.0 <= metrics[f"{method}.{prefix}{kind}"] <= 1.0
    for key in ("dense.localisation.colour", "dense.localisation.shape", "readout.spatial", "readout.binding"):
        assert 0.0 <= metrics[key] <= 1.0
    assert 0.0 < metrics["dense.localisation.chance"] < 0.3
    assert not any(k.startswith("dcsm.") for k in dense_metrics(model, None, seed=0, n=4, mean=pre.mean, std=pre.std))


def test_localisation_finds_patches_that_carry_the_words_features(model, monkeypatch) -> None:
    """An oracle image tower whose patches on each object are the sum of that object's word
    features: every word's best patch must then be on its object (checks grid order)."""
    from clipcore.models.dense import DenseEncoder
    from training.alignment import patch_masks
    from training.evaluation.world import dcsm as world_dcsm
    from training.world.captions import full_caption
    from training.world.scene import Split, sample_scene

    encoder = DenseEncoder(model, 32, {})
    scenes = [sample_scene(Split.TEST, 0, world_dcsm.SPAN_OFFSET + i) for i in range(40)]

    words = world_dcsm.WordSpans(encoder, (*world_dcsm.COLOUR_NAMES, *world_dcsm.SHAPES))

    def oracle(images):
        text = encoder.text_features([full_caption(s) for s in scenes])
        out = torch.zeros(len(scenes), 65, text.tokens.shape[-1])
        out[:, 1:] = -text.tokens[:, 1:2]  # background: away from everything said
        for b, scene in enumerate(scenes):
            spans = words.spans(full_caption(scene))
            cover = torch.from_numpy(patch_masks(scene, 64, 8))
            for k, o in enumerate(scene.objects):
                feature = sum(text.tokens[b, e - 1] for _, e, w in spans if w in (o.colour, o.shape))
                out[b, 1:][cover[k] >= 0.5 * cover[k].max()] = feature
        return torch.nn.functional.normalize(out, dim=-1)

    monkeypatch.setattr(encoder, "image_tokens", oracle)
    result = world_dcsm.localisation(encoder, seed=0, n=40)
    assert result["colour"] > 0.9 and result["shape"] > 0.9
    assert 0.02 < result["chance"] < 0.2
