"""YUKINO: matching rule, Winoground figures, pseudo-token prompts and OTI on a real tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from clipcore.methods.losses import yukino_matching_loss, yukino_oti_loss
from clipcore.methods.yukino import paired_yes_no_scores, winoground, yes_no_scores
from clipcore.models.clip_model import build_model
from clipcore.models.components import Components
from clipcore.models.yukino import NO_PROMPT, YES_PROMPT, Inverter, YukinoHead, prompt_features, prompt_tokens
from training.train_yukino import OTIConfig, concept_embeddings, oti

SMOKE = Path(__file__).resolve().parents[3] / "training" / "configs" / "shapes-smoke.json"


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(json.loads(SMOKE.read_text())).eval()


def test_yes_no_scores() -> None:
    yes = np.array([[1.0, 0.0]], dtype=np.float32)
    no = np.array([[0.0, 1.0]], dtype=np.float32)
    captions = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    np.testing.assert_allclose(yes_no_scores(yes, no, captions), [[1.0, -1.0, -0.2]], atol=1e-6)
    two = np.concatenate([yes, no])
    np.testing.assert_allclose(paired_yes_no_scores(two, two[::-1], captions[:2]), [1.0, 1.0], atol=1e-6)
    with pytest.raises(ValueError):
        yes_no_scores(yes, no[:, :1], captions)


def test_winoground_text_image_group() -> None:
    # Item 0 right everywhere; item 1: both images prefer caption 0 (text fails, image holds).
    s00, s01 = np.array([0.9, 0.9]), np.array([0.1, 0.1])
    s10, s11 = np.array([0.2, 0.8]), np.array([0.8, 0.5])
    out = winoground(s00, s01, s10, s11)
    assert out["text"].tolist() == [True, False]
    assert out["image"].tolist() == [True, True]
    assert out["group"].tolist() == [True, False]


def test_prompts_keep_the_placeholder_as_one_token(tiny: torch.nn.Module) -> None:
    tokens, placeholder = prompt_tokens(tiny.context_length)
    assert (tokens == placeholder).sum(dim=1).tolist() == [1, 1], (YES_PROMPT, NO_PROMPT)


def test_pseudo_token_drives_the_prompt_features(tiny: torch.nn.Module) -> None:
    v = torch.randn(3, tiny.token_embedding.weight.shape[1], requires_grad=True)
    yes, no = prompt_features(tiny, v, tiny.context_length)
    assert yes.shape == no.shape == (3, tiny.text_projection.shape[1])
    assert not torch.allclose(yes[0], yes[1]), "different pseudo-tokens give different prompts"
    assert not torch.allclose(yes, no), "the 'no' prompt differs from the 'yes' prompt"
    (yes.sum() - no.sum()).backward()
    assert v.grad is not None and v.grad.abs().sum() > 0


def test_oti_lowers_its_loss(tiny: torch.nn.Module) -> None:
    targets = torch.nn.functional.normalize(torch.randn(4, tiny.text_projection.shape[1]), dim=-1)
    concepts = concept_embeddings(tiny)

    def loss_of(v: torch.Tensor) -> float:
        with torch.no_grad():
            yes, no = prompt_features(tiny, v, tiny.context_length)
            return float(yukino_oti_loss(yes, no, targets, v, concepts).mean())

    start = concepts.mean(0, keepdim=True).repeat(4, 1)
    with torch.no_grad():  # OTI must still optimise when called without gradients
        found = oti(tiny, targets, OTIConfig(steps=30))
    assert loss_of(found) < loss_of(start) - 0.05


def test_matching_loss_prefers_the_true_caption_and_the_true_image() -> None:
    basis = torch.eye(4)
    yes, no = basis[:2], torch.zeros(2, 4)
    right = yukino_matching_loss(yes, no, basis[:2], 10.0)
    swapped = yukino_matching_loss(yes, no, basis[[1, 0]], 10.0)
    assert right.item() < 0.01 and swapped.item() > 10.0
    # Image side: caption 0 fits both images; only the column term tells image 1 is the worse one.
    captions = torch.nn.functional.normalize(torch.tensor([[1.0, 0.2, 0, 0], [0, 1.0, 0, 0]]), dim=-1)
    both_fit = torch.tensor([[1.0, 0, 0, 0], [1.0, 1.0, 0, 0]])
    assert yukino_matching_loss(both_fit, no, captions, 10.0) > yukino_matching_loss(yes, no, captions, 10.0) + 1.0


def test_head_round_trips_through_files(tmp_path: Path) -> None:
    head = YukinoHead(Inverter(12, 4, width=8), "semclip", {"in_dim": 12, "token_dim": 4, "width": 8})
    files, component = head.to_files()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    loaded = YukinoHead.from_components(tmp_path, Components.from_manifest({"yukino": component}))
    assert loaded is not None and loaded.text_encoder == "semclip"
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(loaded.inverter(x), head.inverter.eval()(x), atol=2e-3, rtol=2e-3)  # fp16 on disk
    assert YukinoHead.from_components(tmp_path, Components()) is None
