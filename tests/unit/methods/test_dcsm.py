"""DCSM: functional rows on the right token positions, per-map z-scores, scorer, loss."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from clipcore.methods.dcsm import (
    DEFAULT_SCORER_CONFIG,
    FUNCTIONAL_GROUPS,
    DCSMScorer,
    candidate_pairs,
    dcsm_scores,
    functional_row_table,
    place_functional_rows,
    prepare_maps,
    similarity_map,
    zscore_map,
)
from clipcore.methods.losses import dcsm_batch_loss, dcsm_loss
from clipcore.models.clip_model import build_model
from clipcore.models.dense import DCSMHead, DenseEncoder, dcsm_state_bytes

SMOKE = Path(__file__).resolve().parents[3] / "training" / "configs" / "shapes-smoke.json"
GROUP = {g: i for i, g in enumerate(sorted(FUNCTIONAL_GROUPS))}  # rows follow group names


@pytest.fixture(autouse=True)
def one_thread():
    # Small tensors on a shared CPU: one thread avoids OpenMP threads waiting on each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(json.loads(SMOKE.read_text())).eval()


@pytest.fixture(scope="module")
def encoder(model) -> DenseEncoder:
    return DenseEncoder(model, 32)


def positions(rows: torch.Tensor) -> dict[int, int]:
    return {int(t): int(rows[t]) for t in torch.nonzero(rows >= 0).flatten()}


# ----------------------------------------------------------------------------- functional rows
def test_functional_row_lands_on_the_words_own_token(encoder: DenseEncoder) -> None:
    text = "a circle to the left of a square"
    f = encoder.text_features([text])
    # [start] a circle to the left of a square [end]: "left" is token 5, counting the start token.
    assert positions(f.row_index[0]) == {5: GROUP["left"]}
    ids = encoder.tokenizer([text])[0]
    assert int(ids[0]) == encoder.tokenizer.sot_token_id
    assert int(ids[5]) == encoder.tokenizer.encode("left")[0]
    assert f.words == [["left"]]


def test_first_word_after_the_start_token(encoder: DenseEncoder) -> None:
    f = encoder.text_features(["not a red circle", "no square"])
    assert positions(f.row_index[0]) == {1: GROUP["negation"]}
    assert positions(f.row_index[1]) == {1: GROUP["negation"]}


def test_multi_token_word_gets_the_row_on_every_piece(model) -> None:
    enc = DenseEncoder(model, 32, {"hue": ("cyan",), "negation": ("no",)})
    assert len(enc.tokenizer.encode("cyan")) == 2
    f = enc.text_features(["a photo with no cyan square."])
    # [start] a photo with no cy an square . [end]
    assert positions(f.row_index[0]) == {4: 1, 5: 0, 6: 0}
    table = functional_row_table(enc.groups, 65, seed=3)
    img = F.normalize(torch.randn(1, 65, 32), dim=-1)
    maps = prepare_maps(img, f.tokens, f.valid, f.row_index, table)
    assert torch.equal(maps[0, 5], table[0]) and torch.equal(maps[0, 6], table[0])
    assert torch.equal(maps[0, 4], table[1])


def test_synonyms_share_one_row(encoder: DenseEncoder) -> None:
    f = encoder.text_features(["a circle above a square", "a circle over a square",
                               "a circle below a square", "a circle under a square", "a circle beneath a square",
                               "a tiny circle", "a little circle", "a huge circle", "a big circle"])  # fmt: skip
    rows = [set(positions(r).values()) for r in f.row_index]
    assert rows[0] == rows[1] == {GROUP["above"]}
    assert rows[2] == rows[3] == rows[4] == {GROUP["below"]}
    assert rows[5] == rows[6] == {GROUP["small"]} and rows[7] == rows[8] == {GROUP["big"]}


def test_words_inside_other_words_are_not_matched(encoder: DenseEncoder, model) -> None:
    # BPE ends these with the functional word's own token: re+but, s+not, k+left, half+big.
    for word, piece in (("rebut", "but"), ("snot", "not"), ("kleft", "left"), ("halfbig", "big")):
        ids = encoder.tokenizer.encode(word)
        assert ids[-1] == encoder.tokenizer.encode(piece)[0] and len(ids) == 2
    f = encoder.text_features(["a rebut of snot kleft halfbig", "a knot"])
    assert not bool((f.row_index >= 0).any())
    enc = DenseEncoder(model, 32, {"article": ("an",)})
    assert positions(enc.text_features(["a cyan circle"]).row_index[0]) == {}  # cy + an</w>
    assert positions(enc.text_features(["an orange circle"]).row_index[0]) == {1: 0}


def test_padding_truncation_and_validity(encoder: DenseEncoder) -> None:
    long = " ".join(["red circle"] * 20) + " left"
    f = encoder.text_features(["a red circle", long])
    assert f.tokens.shape == (2, 30, 32) and f.valid.shape == (2, 30)
    assert f.valid[0].sum() == 5 and not bool(f.valid[0, 5:].any())  # start a red circle end
    assert torch.all(f.tokens[0, 5:] == 0)
    assert bool(f.valid[1].all()) and f.truncated == [False, True]
    assert not bool((f.row_index[1] >= 0).any())  # "left" fell off the end
    assert torch.allclose(f.tokens[0, :5].norm(dim=-1), torch.ones(5), atol=1e-5)


def test_image_tokens_are_normalised_class_plus_patches(encoder: DenseEncoder) -> None:
    images = torch.randint(0, 255, (2, 64, 64, 3), dtype=torch.uint8).numpy()
    tok = encoder.image_tokens(images)
    assert tok.shape == (2, 65, 32)
    assert torch.allclose(tok.norm(dim=-1), torch.ones(2, 65), atol=1e-5)


# ----------------------------------------------------------------------------- maps
def test_similarity_map_is_cosine_with_zero_padding() -> None:
    img, txt = torch.randn(2, 5, 4), torch.randn(2, 3, 4)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    sim = similarity_map(img, txt, valid)
    expected = F.normalize(txt, dim=-1) @ F.normalize(img, dim=-1).transpose(1, 2)
    assert torch.allclose(sim[1], expected[1], atol=1e-6)
    assert torch.allclose(sim[0, :2], expected[0, :2], atol=1e-6) and torch.all(sim[0, 2] == 0)


def test_zscore_uses_only_valid_rows_of_its_own_map() -> None:
    sim = torch.randn(3, 4, 6)
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    z = zscore_map(sim, valid)
    for b in range(3):
        v = z[b][valid[b]]
        assert abs(float(v.mean())) < 1e-5 and abs(float(v.std(unbiased=False)) - 1) < 1e-4
        assert torch.all(z[b][~valid[b]] == 0)
    # A map's z-score does not depend on the other maps of the batch.
    assert torch.allclose(zscore_map(sim[1:2], valid[1:2]), z[1:2], atol=1e-6)


def test_place_functional_rows_copies_and_replaces() -> None:
    sim = torch.randn(2, 4, 6)
    before = sim.clone()
    rows = torch.tensor([[-1, 2, -1, -1], [0, -1, -1, 2]])
    table = functional_row_table(["a", "b", "c"], 6, seed=0)
    out = place_functional_rows(sim, rows, table)
    assert torch.equal(sim, before)
    assert torch.equal(out[0, 1], table[2]) and torch.equal(out[1, 0], table[0]) and torch.equal(out[1, 3], table[2])
    assert torch.equal(out[0, 0], sim[0, 0])


def test_functional_table_is_fixed_by_its_seed() -> None:
    a = functional_row_table(FUNCTIONAL_GROUPS, 65, seed=7)
    assert a.shape == (len(FUNCTIONAL_GROUPS), 65)
    assert torch.equal(a, functional_row_table(FUNCTIONAL_GROUPS, 65, seed=7))
    assert not torch.equal(a, functional_row_table(FUNCTIONAL_GROUPS, 65, seed=8))


def test_a_pairs_score_is_the_same_alone_and_in_a_batch(encoder: DenseEncoder) -> None:
    torch.manual_seed(1)
    scorer = DCSMScorer().eval()
    table = functional_row_table(FUNCTIONAL_GROUPS, 65, seed=0)
    images = torch.randint(0, 255, (4, 64, 64, 3), dtype=torch.uint8).numpy()
    img = encoder.image_tokens(images)
    f = encoder.text_features(["a red circle to the left of a blue square", "no circle", "a big cross", "a square"])
    with torch.no_grad():
        batch = dcsm_scores(scorer, prepare_maps(img, f.tokens, f.valid, f.row_index, table))
        alone = dcsm_scores(scorer, prepare_maps(img[:1], f.tokens[:1], f.valid[:1], f.row_index[:1], table))
        other = dcsm_scores(
            scorer, prepare_maps(img[[0, 3]], f.tokens[[0, 0]], f.valid[[0, 0]], f.row_index[[0, 0]], table)
        )
    assert torch.allclose(alone, batch[:1], atol=1e-5) and torch.allclose(other[:1], batch[:1], atol=1e-5)


# ----------------------------------------------------------------------------- scorer
def test_scorer_layouts_and_size() -> None:
    grid = DCSMScorer()
    assert 250_000 < sum(p.numel() for p in grid.parameters()) < 320_000
    maps = torch.randn(3, 30, 65)
    assert grid(maps).shape == (3,)
    ref = DCSMScorer({"layout": "reference"})
    assert ref(maps).shape == (3,)
    with pytest.raises(ValueError):
        grid(torch.randn(3, 29, 65))
    with pytest.raises(ValueError):
        DCSMScorer({"layout": "nope"})


def test_head_round_trip_through_safetensors_bytes() -> None:
    torch.manual_seed(2)
    cfg = {**DEFAULT_SCORER_CONFIG, "functional_groups": {"left": ["left"]}}
    scorer = DCSMScorer(cfg).eval()
    table = functional_row_table(cfg["functional_groups"], 65, seed=0)
    head = DCSMHead.from_bytes(dcsm_state_bytes(scorer.state_dict(), table), cfg)
    maps = torch.randn(2, 30, 65)
    assert torch.allclose(head.scorer(maps), scorer(maps)) and torch.equal(head.table, table)
    assert head.functional_groups == {"left": ("left",)}


# ----------------------------------------------------------------------------- loss
def test_loss_hand_case() -> None:
    # Each side: -log(e^1 / (e^1 + e^0)) = log(1 + e^-1).
    one = torch.tensor([[1.0, 0.0]])
    assert dcsm_loss(one, one).item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    # Uniform scores over 4 candidates: log 4; the two sides are averaged.
    flat = torch.zeros(3, 4)
    assert dcsm_loss(flat, flat).item() == pytest.approx(math.log(4), abs=1e-6)
    assert dcsm_loss(one, flat[:1]).item() == pytest.approx((math.log(1 + math.exp(-1)) + math.log(4)) / 2, abs=1e-6)


def test_candidate_sets_hold_positive_hard_negative_and_other_items() -> None:
    cand = candidate_pairs(6, 3, torch.Generator().manual_seed(0))
    assert cand.shape == (12, 5)
    anchors = torch.arange(12)
    assert torch.equal(cand[:, 0], anchors) and torch.equal(cand[:, 1], anchors ^ 1)
    assert torch.all(cand[:, 2:] // 2 != (anchors // 2)[:, None])  # randoms come from other items
    assert int(cand.max()) < 12 and int(cand.min()) >= 0


def test_batch_loss_equals_scoring_every_candidate_pair_explicitly() -> None:
    torch.manual_seed(0)
    n2 = 8
    img, txt = F.normalize(torch.randn(n2, 65, 16), dim=-1), F.normalize(torch.randn(n2, 30, 16), dim=-1)
    valid = torch.zeros(n2, 30, dtype=torch.bool)
    valid[:, :12] = True
    rows = torch.full((n2, 30), -1)
    rows[:, 3] = 2
    table = functional_row_table(FUNCTIONAL_GROUPS, 65, 0)
    scorer = DCSMScorer().eval()
    loss, _ = dcsm_batch_loss(scorer, img, txt, valid, rows, table, 2, torch.Generator().manual_seed(1))
    cand = candidate_pairs(n2 // 2, 2, torch.Generator().manual_seed(1))

    def s(i: int, t: int) -> torch.Tensor:
        return scorer(prepare_maps(img[i : i + 1], txt[t : t + 1], valid[t : t + 1], rows[t : t + 1], table))[0]

    image_scores = torch.stack([torch.stack([s(a, int(c)) for c in cand[a]]) for a in range(n2)])
    text_scores = torch.stack([torch.stack([s(int(c), a) for c in cand[a]]) for a in range(n2)])
    assert loss.item() == pytest.approx(dcsm_loss(image_scores, text_scores).item(), abs=1e-5)


def test_loss_decreases_on_a_tiny_overfit_run() -> None:
    torch.manual_seed(0)
    n2 = 32
    img, txt = F.normalize(torch.randn(n2, 65, 16), dim=-1), F.normalize(torch.randn(n2, 30, 16), dim=-1)
    valid = torch.ones(n2, 30, dtype=torch.bool)
    rows = torch.full((n2, 30), -1)
    table = functional_row_table(FUNCTIONAL_GROUPS, 65, 0)
    scorer = DCSMScorer({"channels": 8, "hidden": 64, "dropout": 0.0})
    opt = torch.optim.AdamW(scorer.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses, accs = [], []
    for _ in range(80):
        loss, acc = dcsm_batch_loss(scorer, img, txt, valid, rows, table, 1, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        accs.append(acc.item())
    assert losses[0] > 0.9 and sum(losses[-5:]) / 5 < 0.5 * losses[0]
    assert accs[-1] == 1.0
