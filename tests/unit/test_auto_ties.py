"""``auto``'s decision from scripted rounds (nothing is timed): leaving the reference needs a clear
margin over it; leaders that the rounds cannot rank are split by the stated tie-break (least
memory, then fewest moving parts, then the candidates' order) instead of deferring to the
reference; deferred only when it is unclear whether any candidate beats the reference at all.

The figures of the first test are those that once served torch fp32 on a ViT-B-32, 4x slower than
either int8 runtime, because the two int8 runtimes tied: torch fp32 11.7, torch bf16 22.6, torch
int8 44.8, ONNX fp32 19.2, ONNX int8 46.6 images/s (ONNX int8 over torch int8 1.10x with a spread
of 0.18)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipcore.backends import auto
from clipcore.backends.base import ServingTowers

Pair = tuple[str, str]
REF: Pair = ("torch", "fp32")
BF16: Pair = ("torch", "bf16")
TORCH_INT8: Pair = ("torch", "int8")
ONNX_FP32: Pair = ("onnx", "fp32")
ONNX_INT8: Pair = ("onnx", "int8")
# Per-round ratios that put a candidate above MIN_GAIN in some rounds, not by a margin its spread
# allows (median 1.1, interquartile range / median 0.18): ``compare`` says unclear.
UNCLEAR = [1.0, 1.2, 1.1, 0.95, 1.25]
FLAT = [1.0] * 5


def rounds_of(base: float, ratios: Sequence[float] = (1.0, 1.01, 0.99, 1.02, 0.98)) -> list[float]:
    return [base * r for r in ratios]


def bug_scores() -> dict[Pair, list[float]]:
    """The figures of the module doc, per round: ONNX int8 over torch int8 by ``UNCLEAR``."""
    torch_int8 = rounds_of(44.8)
    return {
        REF: rounds_of(11.7),
        BF16: rounds_of(22.6),
        TORCH_INT8: torch_int8,
        ONNX_FP32: rounds_of(19.2),
        ONNX_INT8: [t * r for t, r in zip(torch_int8, UNCLEAR, strict=True)],
    }


def decide(scores: dict[Pair, list[float]]) -> tuple[auto.AutoDecision, Pair]:
    trials = [auto.Trial(*pair) for pair in scores]
    decision, index = auto._decide(trials, list(scores.values()), elapsed=1.0)
    return decision, list(scores)[index]


def test_two_int8_leaders_that_tie_serve_one_of_them_not_the_4x_slower_reference() -> None:
    scores = bug_scores()
    assert auto.compare(scores[ONNX_INT8], scores[TORCH_INT8])[2] == "unclear"  # the tie
    decision, serving = decide(scores)
    assert decision.outcome == "chosen", decision
    assert serving == TORCH_INT8 == (decision.backend, decision.precision)  # int8 alike: torch has fewer parts
    assert decision.margin is not None and decision.margin > 3.5  # over the reference
    assert decision.tie == ("torch int8", "onnx int8")
    assert decision.reason is not None
    assert "torch int8, onnx int8" in decision.reason and "onnx int8 over torch int8: 1.10x" in decision.reason
    assert "the fewest moving parts (torch)" in decision.reason


def test_a_leader_alone_is_chosen_with_no_tie() -> None:
    scores = bug_scores()
    scores[ONNX_INT8] = rounds_of(44.8 * 1.5)  # clearly ahead of torch int8
    decision, serving = decide(scores)
    assert (decision.outcome, serving, decision.tie, decision.reason) == ("chosen", ONNX_INT8, None, None)


def test_the_best_candidate_not_clearly_faster_than_the_reference_defers() -> None:
    scores = {REF: rounds_of(100.0, FLAT), ONNX_FP32: rounds_of(100.0, UNCLEAR), ONNX_INT8: rounds_of(80.0)}
    assert auto.compare(scores[ONNX_FP32], scores[REF])[2] == "unclear"
    decision, serving = decide(scores)
    assert (decision.outcome, serving) == ("deferred", REF)
    assert decision.reason is not None and decision.reason.startswith("onnx fp32 over torch fp32: 1.10x")
    assert decision.tie is None


def test_two_candidates_tied_with_each_other_and_unclear_against_the_reference_still_defer() -> None:
    scores = {REF: rounds_of(100.0, FLAT), TORCH_INT8: rounds_of(100.0, UNCLEAR), ONNX_INT8: rounds_of(101.0, UNCLEAR)}
    decision, serving = decide(scores)
    assert (decision.outcome, serving) == ("deferred", REF)
    assert decision.reason is not None and decision.reason.startswith("onnx int8 over torch fp32")  # the larger


def test_a_candidate_unclear_against_the_reference_is_no_leader() -> None:
    """One candidate clearly faster, another whose own comparison with the reference is unclear and
    that the first is clearly faster than: the clear one serves, alone."""
    scores = {REF: rounds_of(100.0, FLAT), ONNX_FP32: rounds_of(300.0), ONNX_INT8: rounds_of(100.0, UNCLEAR)}
    assert auto.compare(scores[ONNX_INT8], scores[REF])[2] == "unclear"
    decision, serving = decide(scores)
    assert (decision.outcome, serving, decision.tie) == ("chosen", ONNX_FP32, None)


def test_a_margin_no_larger_than_the_noise_defers() -> None:
    """The best is clearly faster than the reference (1.2x), but a candidate it cannot be told from
    cannot be told from the reference either: the rounds' noise is as large as the margin (how
    equal candidates beside spinning processes show a false margin, tests/unit/test_auto_noise.py)."""
    scores = {
        REF: rounds_of(100.0, FLAT),
        ONNX_FP32: rounds_of(100.0, [1.2, 1.18, 1.22, 1.19, 1.21]),
        ONNX_INT8: rounds_of(100.0, [1.0, 1.3, 1.15, 0.95, 1.35]),
    }
    assert auto.compare(scores[ONNX_FP32], scores[REF])[2] == "faster"
    assert auto.compare(scores[ONNX_INT8], scores[REF])[2] == "unclear"
    assert auto.compare(scores[ONNX_FP32], scores[ONNX_INT8])[2] != "faster"
    decision, serving = decide(scores)
    assert (decision.outcome, serving, decision.tie) == ("deferred", REF, None)
    assert decision.reason is not None
    assert decision.reason.startswith("onnx fp32 over torch fp32: 1.20x, but onnx int8, which the rounds cannot")
    assert decision.margin == pytest.approx(1.15)  # the unclear comparison's


def test_leaders_whose_margin_is_within_the_noise_of_their_tie_defer() -> None:
    """Two leaders, each "clearly" 1.3x the reference by its own rounds, but the rounds between them
    vary by more than that gain leaves over their spread: a noise as large as the margin (how two
    equal candidates beside spinning processes both pass for faster than a disturbed reference)."""
    scores = {
        REF: rounds_of(100.0, FLAT),
        ONNX_FP32: rounds_of(100.0, [1.3, 1.25, 1.35, 1.28, 1.32]),
        ONNX_INT8: rounds_of(100.0, [1.3, 1.6, 1.0, 1.35, 1.1]),
    }
    assert [auto.compare(scores[c], scores[REF])[2] for c in (ONNX_FP32, ONNX_INT8)] == ["faster", "faster"]
    assert auto.compare(scores[ONNX_FP32], scores[ONNX_INT8])[2] == "unclear"
    decision, serving = decide(scores)
    assert (decision.outcome, serving, decision.tie) == ("deferred", REF, None)
    assert decision.reason is not None
    assert decision.reason.startswith("onnx int8 over torch fp32: 1.30x with a spread of 0.19, within that and")
    assert "between the leaders onnx fp32, onnx int8" in decision.reason


def test_no_candidate_faster_in_any_round_keeps_the_reference_as_a_decision() -> None:
    decision, serving = decide({REF: rounds_of(100.0), ONNX_FP32: rounds_of(100.0), ONNX_INT8: rounds_of(90.0)})
    assert (decision.outcome, serving, decision.margin) == ("chosen", REF, 1.0)


def test_the_tie_break_order_least_memory_then_fewest_moving_parts() -> None:
    every = [REF, BF16, ("torch", "fp16"), ("torch-graphs", "fp16"), TORCH_INT8, ONNX_FP32, ONNX_INT8]
    ranked = sorted(every, key=auto.tie_break)  # a stable sort: equal keys keep the candidates' order
    assert ranked == [TORCH_INT8, ONNX_INT8, REF, BF16, ("torch", "fp16"), ("torch-graphs", "fp16"), ONNX_FP32]
    assert auto.tie_break(("torch", "int4")) > auto.tie_break(ONNX_FP32)  # an unknown precision: most memory
    assert auto.tie_break(("tvm", "int8")) > auto.tie_break(ONNX_INT8)  # an unknown backend: most parts
    assert auto.tie_break(("tvm", "int8")) < auto.tie_break(BF16)  # memory first


@pytest.mark.parametrize(
    ("leaders", "expected", "why"),
    [
        ([BF16, ONNX_INT8], ONNX_INT8, "the least memory (int8, bytes per weight: 1)"),
        ([BF16, ONNX_FP32], BF16, "the fewest moving parts (torch)"),
        ([("torch", "fp16"), ("torch-graphs", "fp16"), ONNX_FP32], ("torch", "fp16"), "moving parts (torch)"),
        ([("torch-graphs", "fp16"), ONNX_FP32], ("torch-graphs", "fp16"), "moving parts (torch-graphs)"),
    ],
)
def test_the_tie_break_picks_among_leaders_whatever_their_order(leaders: list[Pair], expected: Pair, why: str) -> None:
    for order in (leaders, leaders[::-1]):
        scores = {REF: rounds_of(100.0)}
        for k, pair in enumerate(order):  # about 3x the reference, within 1 % of each other
            scores[pair] = rounds_of(300.0 + k)
        decision, serving = decide(scores)
        assert (decision.outcome, serving) == ("chosen", expected), decision
        assert decision.tie == tuple(f"{b} {p}" for b, p in order)
        assert decision.reason is not None and why in decision.reason


def test_the_reference_is_never_a_leader() -> None:
    """``backend=auto precision=int8``: torch int8 is the reference (first); the tie-break would put
    it first, but ONNX int8, clearly faster than it, serves."""
    decision, serving = decide({TORCH_INT8: rounds_of(100.0), ONNX_INT8: rounds_of(150.0)})
    assert (decision.outcome, serving, decision.tie) == ("chosen", ONNX_INT8, None)


class Bundle:
    name, version, ref, image_size = "tiny", "v1", "tiny@v1", 8


class Encoder:
    def __init__(self, pair: Pair) -> None:
        self.pair = pair

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return np.zeros((len(batch), 4), dtype=np.float32)


def test_a_tie_is_kept_in_the_decision_file_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``fastest_towers``: the decision file keeps the chosen leader with the tie (older
    readers look at ``chosen`` only), and the next load builds it untimed, the tie remembered."""
    scores = bug_scores()
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": list(scores))
    monkeypatch.setattr(auto, "decision_path", lambda root, *args, **kwargs: root / "auto" / "tiny" / "v1.json")

    def build(backend: str, precision: str) -> Any:
        towers = ServingTowers.__new__(ServingTowers)
        towers.encode_images = Encoder((backend, precision))  # type: ignore[method-assign,assignment]
        return towers, f"{backend} {precision}"

    def scripted(encoders: Sequence[Encoder], image_size: int, seconds: float, rounds: int = auto.ROUNDS,
                 batch_sizes: Sequence[int] = auto.TIMED_BATCHES) -> list[list[dict[str, float]]]:  # fmt: skip
        return [[{str(b): s for b in batch_sizes} for s in scores[e.pair]] for e in encoders]

    monkeypatch.setattr(auto, "time_rounds", scripted)
    towers, described = auto.fastest_towers(Bundle(), build, device="cpu", cache_root=tmp_path, threads=None)  # type: ignore[arg-type]
    assert towers.auto is not None and towers.auto.outcome == "chosen"
    assert described.startswith("torch int8") and "leaders within each other's noise" in described
    record = json.loads((tmp_path / "auto" / "tiny" / "v1.json").read_text())
    assert record["chosen"] == {"backend": "torch", "precision": "int8"}
    assert record["decision"]["tie"] == ["torch int8", "onnx int8"] and "serves" in record["decision"]["reason"]

    def must_not_time(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a kept decision was measured again")

    monkeypatch.setattr(auto, "time_rounds", must_not_time)
    again, described = auto.fastest_towers(Bundle(), build, device="cpu", cache_root=tmp_path, threads=None)  # type: ignore[arg-type]
    assert again.auto is not None and again.auto.outcome == "remembered" and "remembered in" in described
    assert (again.auto.backend, again.auto.precision, again.auto.tie) == ("torch", "int8", ("torch int8", "onnx int8"))
