"""``precision=auto`` on CUDA, decided from injected timings (no GPU needed): the batch sizes timed
go up to the batcher's largest batch, large batches weigh most, and with the figures an H200
gave (docs/benchmarks-notebook.md, "GPU") fp16 beats fp32 and CUDA graphs beat both, where the CPU's rule
(batch 1 and 8, equal weights) kept fp32. The CUDA-graph towers' bucketing is checked on the CPU
with a capture that calls the tower directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clipcore.backends import auto
from clipcore.backends.base import BackendError, ServingTowers
from clipcore.backends.cuda_graphs import GraphedTorchTowers, bucket_for, buckets
from clipcore.backends.select import select_towers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

# images/s of the ViT-B-32 image tower on one H200 at batch 1 / 8 / 32 / 128 (docs/benchmarks.md).
H200 = {
    ("torch", "fp32"): {"1": 320.0, "8": 1896.0, "32": 3267.0, "128": 3874.0},
    ("torch", "fp16"): {"1": 182.0, "8": 1330.0, "32": 5002.0, "128": 15530.0},
    ("torch-graphs", "fp16"): {"1": 794.0, "8": 3849.0, "32": 11907.0, "128": 19882.0},
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> ModelBundle:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("auto-cuda-store")
    publish_model(root, "tiny", seed=5)
    return ModelBundle.load(ModelStore(root), "tiny@production")


class Stub:
    """Pooled towers that are never timed here (``time_rounds`` is replaced)."""

    variants: list[str] = []

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        return np.zeros((len(images), 4), dtype=np.float32)

    def encode_tokens(self, tokens: Any, variant: str | None = None) -> np.ndarray:
        return np.zeros((len(tokens), 4), dtype=np.float32)


def test_cuda_times_the_batch_sizes_a_loaded_gpu_forms() -> None:
    assert auto.timed_batches("cpu", 64) == (1, 8)  # the CPU rule is unchanged
    assert auto.timed_batches("cpu", 4) == (1, 4)
    assert auto.timed_batches("cuda", 64) == (1, 8, 32, 64)
    assert auto.timed_batches("cuda:1", 128) == (1, 8, 32, 128)
    assert auto.timed_batches("cuda", 256) == (1, 8, 32, 128, 256)
    assert auto.timed_batches("cuda", 600) == (1, 8, 32, 128, 512, 600)
    assert auto.timed_batches("cuda", 8) == (1, 8)
    assert auto.timed_batches("cuda", 1) == (1,)
    assert auto.batch_weights((1, 8, 32, 128), "cuda") == {"1": 1.0, "8": 4.0, "32": 6.0, "128": 8.0}
    assert auto.batch_weights((1, 8), "cpu") == {"1": 1.0, "8": 1.0}


def test_weighted_score_is_the_geometric_mean_with_equal_weights() -> None:
    figures = {"1": 10.0, "8": 40.0}
    assert auto.geometric_mean(figures) == pytest.approx(20.0)
    assert auto.geometric_mean(figures, {"1": 1.0, "8": 1.0}) == pytest.approx(20.0)
    assert auto.geometric_mean(figures, {"1": 1.0, "8": 3.0}) == pytest.approx(10.0**0.25 * 40.0**0.75)
    assert auto.geometric_mean({}) == 0.0


def test_cuda_candidates_include_cuda_graphs_and_cpu_ones_do_not() -> None:
    on_cuda = auto.candidates("cuda")
    assert on_cuda[:3] == [("torch", "fp32"), ("torch", "fp16"), ("torch-graphs", "fp16")]
    assert auto.candidates("cuda", "fp16") == [("torch", "fp16"), ("torch-graphs", "fp16")]
    assert all(backend != "torch-graphs" for backend, _ in auto.candidates("cpu"))


def decide_with(
    bundle: ModelBundle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    figures: dict[tuple[str, str], dict[str, float]],
    *,
    device: str = "cuda",
    max_batch: int = 128,
) -> tuple[ServingTowers, list[Sequence[int]]]:
    """``fastest_towers`` with stub candidates (``figures``' keys) timed at ``figures`` (times a
    little per-round noise); returns the towers and the batch sizes each timing call asked for."""
    order = list(figures)
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": order)
    built: dict[int, tuple[str, str]] = {}

    def build(backend: str, precision: str) -> tuple[ServingTowers, str]:
        towers = ServingTowers(bundle, Stub())
        built[id(towers.encode_images.__self__)] = (backend, precision)  # type: ignore[attr-defined]
        return towers, f"{backend} {precision}"

    asked: list[Sequence[int]] = []
    jitter = [1.0, 1.02, 0.98, 1.01, 0.99]

    def fake_rounds(encoders: Sequence[Any], image_size: int, seconds: float, rounds: int = auto.ROUNDS,
                    batch_sizes: Sequence[int] = auto.TIMED_BATCHES) -> list[list[dict[str, float]]]:  # fmt: skip
        asked.append(tuple(batch_sizes))
        out = []
        for encode in encoders:
            pair = built[id(encode.__self__)]
            per_batch = figures[pair]
            out.append(
                [{str(b): per_batch[str(b)] * jitter[r % len(jitter)] for b in batch_sizes} for r in range(rounds)]
            )
        return out

    monkeypatch.setattr(auto, "time_rounds", fake_rounds)
    towers, _ = auto.fastest_towers(bundle, build, device=device, cache_root=tmp_path, threads=None,
                                    max_batch=max_batch)  # fmt: skip
    return towers, asked


def test_on_cuda_h200_figures_choose_fp16_over_fp32(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = {k: v for k, v in H200.items() if k[0] == "torch"}
    towers, asked = decide_with(bundle, tmp_path, monkeypatch, figures)
    assert asked == [(1, 8, 32, 128)]
    assert towers.auto is not None and towers.auto.outcome == "chosen"
    assert (towers.auto.backend, towers.auto.precision) == ("torch", "fp16")
    assert towers.auto.margin is not None and towers.auto.margin > auto.MIN_GAIN
    # The CPU rule on the same figures (batch 1 and 8, equal weights) keeps fp32: what the H200 did.
    cpu_rule = {k: {b: v[b] for b in ("1", "8")} for k, v in figures.items()}
    assert auto.geometric_mean(cpu_rule["torch", "fp16"]) < auto.geometric_mean(cpu_rule["torch", "fp32"])


def test_on_cuda_graphs_beat_fp16_and_fp32(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    towers, _ = decide_with(bundle, tmp_path, monkeypatch, H200)
    assert towers.auto is not None and towers.auto.outcome == "chosen"
    assert (towers.auto.backend, towers.auto.precision) == ("torch-graphs", "fp16")


def test_on_cuda_a_candidate_slower_at_every_batch_size_never_wins(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slower = {b: 0.8 * v for b, v in H200["torch", "fp32"].items()}
    towers, _ = decide_with(bundle, tmp_path, monkeypatch, {("torch", "fp32"): H200["torch", "fp32"],
                                                             ("torch", "fp16"): slower})  # fmt: skip
    assert towers.auto is not None and (towers.auto.backend, towers.auto.outcome) == ("torch", "chosen")
    assert towers.auto.precision == "fp32"


def test_on_cuda_batch_one_still_counts(bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10x slower for a lone request and 1.2x faster under load does not win: the lone request's
    weight is small, not zero."""
    fp32 = H200["torch", "fp32"]
    lopsided = {"1": fp32["1"] / 10, "8": fp32["8"] * 1.2, "32": fp32["32"] * 1.2, "128": fp32["128"] * 1.2}
    towers, _ = decide_with(bundle, tmp_path, monkeypatch, {("torch", "fp32"): fp32, ("torch", "fp16"): lopsided})
    assert towers.auto is not None and towers.auto.precision == "fp32"


def test_the_timed_batch_sizes_follow_the_batchers_largest_batch(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = {k: {**v, "64": v["128"]} for k, v in H200.items()}
    _, asked = decide_with(bundle, tmp_path, monkeypatch, figures, max_batch=64)
    assert asked == [(1, 8, 32, 64)]
    # Another largest batch is another decision: not the one kept for 64.
    assert auto.decision_path(tmp_path, bundle, "cuda", None, max_batch=64) != auto.decision_path(
        tmp_path, bundle, "cuda", None, max_batch=128
    )
    assert auto.decision_path(tmp_path, bundle, "cpu", 1, max_batch=64) == auto.decision_path(
        tmp_path, bundle, "cpu", 1, max_batch=128
    )


def test_the_cpu_still_times_batch_1_and_8(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = {("torch", "fp32"): {"1": 10.0, "8": 40.0}, ("onnx", "fp32"): {"1": 30.0, "8": 120.0}}
    towers, asked = decide_with(bundle, tmp_path, monkeypatch, figures, device="cpu", max_batch=64)
    assert asked == [(1, 8)]
    assert towers.auto is not None and towers.auto.backend == "onnx"


def test_buckets_cover_every_batch_up_to_the_largest() -> None:
    assert buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert buckets(1) == (1,)
    sizes = buckets(100)
    for n in range(1, 101):
        b = bucket_for(n, sizes)
        assert b >= n and (b == 1 or sizes[sizes.index(b) - 1] < n)


def test_graphed_towers_pad_and_split_like_the_eager_tower(bundle: ModelBundle) -> None:
    captured: list[int] = []

    def direct(fn: Any, static_in: torch.Tensor) -> Any:
        captured.append(len(static_in))
        return lambda: fn(static_in)

    graphed = GraphedTorchTowers(bundle, max_batch=8, dtype=None, capture=direct)
    assert captured == [1, 2, 4, 8]  # one graph per bucket, built with the towers
    rng = np.random.default_rng(3)
    size = bundle.image_size
    for n in (1, 3, 8, 11, 20):
        pixels = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        pixels.setflags(write=False)  # the embedding cache hands read-only arrays
        got = graphed.encode_images(pixels)
        want = bundle.encode_images(pixels)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)
    texts = bundle.encode_texts(["a red circle."])
    np.testing.assert_allclose(graphed.encode_tokens(bundle.tokenize(["a red circle."])), texts, atol=1e-6)


def test_cuda_graphs_are_refused_off_cuda(bundle: ModelBundle, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="CUDA"):
        select_towers(bundle, backend="torch-graphs", precision="fp16", device="cpu", onnx_cache_root=tmp_path,
                      threads=1)  # fmt: skip
