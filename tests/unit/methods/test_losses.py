import math

import pytest
import torch

from clipcore.methods.losses import clip_contrastive_loss, pcclip_difference_loss, weight_ensemble


def test_clip_loss_all_equal_embeddings_is_log_batch():
    a = torch.tensor([[0.6, 0.8]]).repeat(4, 1)
    assert clip_contrastive_loss(a, a, 10.0).item() == pytest.approx(math.log(4), abs=1e-6)


def test_clip_loss_identity_hand_case():
    eye = torch.eye(2)
    # logits [[1, 0], [0, 1]]: each row -log(e / (e + 1)) = log(1 + e^-1)
    assert clip_contrastive_loss(eye, eye, 1.0).item() == pytest.approx(0.31326169, abs=1e-6)


def test_clip_loss_identity_large_scale_is_near_zero():
    eye = torch.eye(3)
    assert clip_contrastive_loss(eye, eye, 100.0).item() < 1e-6


def test_clip_loss_tensor_scale_gets_gradient():
    log_scale = torch.tensor(0.0, requires_grad=True)
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[0.6, 0.8], [0.8, -0.6]])
    loss = clip_contrastive_loss(a, b, log_scale.exp())
    loss.backward()
    assert torch.isfinite(log_scale.grad)


@pytest.mark.parametrize(
    "a, b, scale",
    [
        (torch.eye(2), torch.eye(3), 1.0),
        (torch.ones(2), torch.ones(2), 1.0),
        (torch.eye(2), torch.eye(2), 0.0),
        (torch.eye(2), torch.eye(2), float("nan")),
        (torch.eye(2), torch.eye(2), torch.ones(2)),
    ],
)
def test_clip_loss_rejects_bad_input(a, b, scale):
    with pytest.raises(ValueError):
        clip_contrastive_loss(a, b, scale)


IMG1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
IMG2 = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
TEXT = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])  # normalised inside to the difference directions


def test_pcclip_contrastive_hand_case():
    # logits = (1/T) * [[1, -1], [-1, 1]]; each row log(1 + exp(-2/T))
    loss = pcclip_difference_loss(IMG1, IMG2, TEXT, temperature=1.0, kind="contrastive")
    assert loss.item() == pytest.approx(0.12692801, abs=1e-6)
    loss = pcclip_difference_loss(IMG1, IMG2, TEXT, temperature=0.5, kind="contrastive")
    assert loss.item() == pytest.approx(0.01814993, abs=1e-6)


def test_pcclip_mse_hand_case():
    # normalize((3, 4)) = (0.6, 0.8); difference (1, -1): ((0.6-1)^2 + (0.8+1)^2) / 2 = 1.7
    text = torch.tensor([[3.0, 4.0]])
    loss = pcclip_difference_loss(IMG1[:1], IMG2[:1], text, temperature=1.0, kind="mse")
    assert loss.item() == pytest.approx(1.7, abs=1e-6)


@pytest.mark.parametrize("kind", ["contrastive", "mse"])
def test_pcclip_zero_difference_has_no_nan(kind):
    img1 = torch.tensor([[0.6, 0.8], [1.0, 0.0]], requires_grad=True)
    img2 = torch.tensor([[0.6, 0.8], [0.0, 1.0]], requires_grad=True)
    text = torch.tensor([[0.0, 1.0], [1.0, -1.0]], requires_grad=True)
    loss = pcclip_difference_loss(img1, img2, text, temperature=1.0, kind=kind)
    loss.backward()
    assert torch.isfinite(loss)
    for t in (img1, img2, text):
        assert torch.isfinite(t.grad).all()


def test_pcclip_does_not_mutate_inputs():
    img1, img2, text = IMG1.clone(), IMG2.clone(), TEXT.clone()
    pcclip_difference_loss(img1, img2, text, temperature=1.0, kind="contrastive")
    assert torch.equal(img1, IMG1) and torch.equal(img2, IMG2) and torch.equal(text, TEXT)


@pytest.mark.parametrize("temperature, kind", [(0.0, "mse"), (-1.0, "contrastive"), (1.0, "l1")])
def test_pcclip_rejects_bad_params(temperature, kind):
    with pytest.raises(ValueError):
        pcclip_difference_loss(IMG1, IMG2, TEXT, temperature=temperature, kind=kind)


def test_pcclip_rejects_shape_mismatch():
    with pytest.raises(ValueError):
        pcclip_difference_loss(IMG1, IMG2[:1], TEXT, temperature=1.0)


def test_weight_ensemble_hand_case():
    base = {
        "w": torch.tensor([0.0, 2.0]),
        "b": torch.tensor([1.0]),
        "only_base": torch.tensor([5.0]),
        "steps": torch.tensor([1]),
    }
    ft = {"w": torch.tensor([2.0, 4.0]), "b": torch.tensor([3.0]), "steps": torch.tensor([7])}
    base_copy = {k: v.clone() for k, v in base.items()}
    ft_copy = {k: v.clone() for k, v in ft.items()}
    out = weight_ensemble(base, ft, 0.25)
    assert torch.allclose(out["w"], torch.tensor([0.5, 2.5]))
    assert torch.allclose(out["b"], torch.tensor([1.5]))
    assert torch.equal(out["only_base"], torch.tensor([5.0]))
    assert torch.equal(out["steps"], torch.tensor([1]))
    assert torch.equal(weight_ensemble(base, ft, 0.75)["steps"], torch.tensor([7]))
    assert out["only_base"].data_ptr() != base["only_base"].data_ptr()
    for k in base:
        assert torch.equal(base[k], base_copy[k])
    for k in ft:
        assert torch.equal(ft[k], ft_copy[k])


def test_weight_ensemble_endpoints():
    base = {"w": torch.tensor([0.5, -1.0])}
    ft = {"w": torch.tensor([2.0, 3.0])}
    assert torch.equal(weight_ensemble(base, ft, 0.0)["w"], base["w"])
    assert torch.equal(weight_ensemble(base, ft, 1.0)["w"], ft["w"])


@pytest.mark.parametrize(
    "base, ft, w",
    [
        ({"w": torch.zeros(2)}, {"w": torch.zeros(3)}, 0.5),
        ({"w": torch.zeros(2)}, {"w": torch.zeros(2), "x": torch.zeros(1)}, 0.5),
        ({"w": torch.zeros(2)}, {"w": torch.zeros(2)}, 1.5),
        ({"w": torch.zeros(2)}, {"w": torch.zeros(2)}, float("nan")),
    ],
)
def test_weight_ensemble_rejects_bad_input(base, ft, w):
    with pytest.raises(ValueError):
        weight_ensemble(base, ft, w)


def test_clip_loss_exclude_drops_those_pairs_as_negatives() -> None:
    a = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]]), dim=-1)
    exclude = torch.zeros(3, 3, dtype=torch.bool)
    exclude[0, 1] = exclude[1, 0] = True  # rows 0 and 1 are near-copies: not each other's negatives
    full, masked = clip_contrastive_loss(a, a, 10.0), clip_contrastive_loss(a, a, 10.0, exclude=exclude)
    assert full.item() > 0.4 and masked.item() < 0.01
    # With the confusable pair excluded, only the remaining (distinct) negative counts.
    exclude[0, 2] = exclude[2, 0] = exclude[1, 2] = exclude[2, 1] = True
    assert clip_contrastive_loss(a, a, 10.0, exclude=exclude).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="False diagonal"):
        clip_contrastive_loss(a, a, 10.0, exclude=torch.eye(3, dtype=torch.bool))
