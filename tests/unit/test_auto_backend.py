"""``precision=auto`` on the tiny model: only gated candidates win, a winner must be clearly faster,
the decision is kept per version and machine, and the CPU it is keyed by is the one that runs.

The AVX2-only CPU kind is run under ``qemu-x86_64 -cpu EPYC-Milan`` (as in
test_int8_portability.py) for what decides the key and the candidates; the candidates' timing
itself runs natively.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clipcore.backends import auto, cpu, parity
from clipcore.backends.base import BackendError, PooledTowers, ServingTowers
from clipcore.backends.parity import PARITY_THRESHOLD, check_parity
from clipcore.backends.select import select_towers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

REPO = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-x86_64")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> ModelBundle:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("auto-store")
    publish_model(root, "tiny", seed=5)
    return ModelBundle.load(ModelStore(root), "tiny@production")


def real_build(bundle: ModelBundle, cache: Path) -> auto.Build:
    def build(backend: str, precision: str) -> tuple[ServingTowers, str]:
        return select_towers(bundle, backend=backend, precision=precision, device="cpu",
                             onnx_cache_root=cache, threads=1)  # fmt: skip

    return build


class Slowed:
    """Towers that answer like ``inner`` but take ``delay_s`` longer per image batch."""

    def __init__(self, inner: PooledTowers, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        time.sleep(self.delay_s)
        return self.inner.encode_images(pixels)


def decision(cache: Path, bundle: ModelBundle) -> dict[str, Any]:
    (path,) = (cache / "auto" / bundle.name).glob(f"{bundle.version}-*.json")
    return dict(json.loads(path.read_text()))


@pytest.mark.slow
def test_auto_serves_a_gated_candidate_and_remembers_the_choice(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    towers, described = select_towers(bundle, backend="torch", precision="auto", device="cpu",
                                      onnx_cache_root=cache, threads=1)  # fmt: skip
    record = decision(cache, bundle)
    tried = [(t["backend"], t["precision"]) for t in record["trials"]]
    assert tried == auto.candidates("cpu")
    assert ("onnx", "int8") in tried and ("onnx", "fp32") in tried  # onnxruntime is in the dev install
    for trial in record["trials"]:
        assert trial["refused"] is not None or set(trial["images_per_s"]) == {"1", "8"}, trial
    chosen = (record["chosen"]["backend"], record["chosen"]["precision"])
    assert described.startswith(f"{chosen[0]} {chosen[1]}") and "auto: " in described
    assert check_parity(bundle, towers.pooled) >= PARITY_THRESHOLD

    # A restart with the same version, settings and CPU builds the winner without timing anything.
    def must_not_time(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a remembered decision was measured again")

    monkeypatch.setattr(auto, "time_rounds", must_not_time)
    again, described = select_towers(bundle, backend="onnx", precision="auto", device="cpu",
                                     onnx_cache_root=cache, threads=1)  # fmt: skip
    assert "remembered in" in described and described.startswith(f"{chosen[0]} {chosen[1]}")
    pixels = parity.probe_images(bundle.image_size, n=2)
    np.testing.assert_allclose(again.encode_images(pixels), towers.encode_images(pixels), atol=1e-5)

    # Another CPU kind (other instruction sets) has its own key: measured there, not trusted from here.
    monkeypatch.setattr(auto, "cpu_identity", lambda: "x86_64 another CPU (instruction sets 0123456789ab)")
    with pytest.raises(AssertionError, match="measured again"):
        select_towers(bundle, backend="torch", precision="auto", device="cpu", onnx_cache_root=cache, threads=1)


@pytest.mark.slow
def test_a_candidate_that_fails_the_gate_is_never_chosen(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parity, "check_parity", lambda bundle, towers: 0.98)  # every stand-in misses the gate
    cache = tmp_path / "cache"
    _, described = select_towers(bundle, backend="torch", precision="auto", device="cpu",
                                 onnx_cache_root=cache, threads=1)  # fmt: skip
    assert described.startswith("torch fp32")
    record = decision(cache, bundle)
    assert record["chosen"] == {"backend": "torch", "precision": "fp32"}
    for trial in record["trials"][1:]:
        assert "0.980000 < 0.999" in trial["refused"] and trial["images_per_s"] is None, trial


@pytest.mark.slow
def test_a_winner_must_be_clearly_faster(bundle: ModelBundle, tmp_path: Path) -> None:
    build = real_build(bundle, tmp_path / "exports")

    def slowed_except(fast: tuple[str, str]) -> auto.Build:
        def slowed(backend: str, precision: str) -> tuple[ServingTowers, str]:
            towers, described = build(backend, precision)
            if (backend, precision) != fast:  # 50 ms per call: far slower than the tiny model's few ms
                towers.pooled = Slowed(towers.pooled, 0.05)  # type: ignore[arg-type,assignment]
            return towers, described

        return slowed

    # ONNX fp32 is the only candidate not slowed down: it wins.
    _, described = auto.fastest_towers(bundle, slowed_except(("onnx", "fp32")), device="cpu",
                                       cache_root=tmp_path / "a", threads=1, seconds=0.2)  # fmt: skip
    assert described.startswith("onnx fp32")
    assert decision(tmp_path / "a", bundle)["chosen"] == {"backend": "onnx", "precision": "fp32"}

    # Every candidate the same towers (timing noise apart): the exact reference stays.
    def same(backend: str, precision: str) -> tuple[ServingTowers, str]:
        towers, _ = build("torch", "fp32")
        towers.pooled = Slowed(towers.pooled, 0.05)  # type: ignore[arg-type,assignment]
        return towers, f"{backend} {precision}"

    _, described = auto.fastest_towers(bundle, same, device="cpu", cache_root=tmp_path / "b", threads=1, seconds=0.2)
    assert described.startswith("torch fp32")


def test_a_remembered_winner_that_no_longer_passes_is_measured_again(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    path = auto.decision_path(cache, bundle, "cpu", 1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"chosen": {"backend": "onnx", "precision": "int8"}}))
    build = real_build(bundle, cache)

    def int8_refused(backend: str, precision: str) -> tuple[ServingTowers, str]:
        if (backend, precision) == ("onnx", "int8"):
            raise BackendError("ONNX backend for tiny refused: min probe cosine 0.990000 < 0.999")
        return build(backend, precision)

    _, described = auto.fastest_towers(bundle, int8_refused, device="cpu", cache_root=cache, threads=1, seconds=0.1)
    assert "auto: remembered in" not in described
    record = json.loads(path.read_text())
    assert record["chosen"] != {"backend": "onnx", "precision": "int8"}
    assert [t["refused"] is not None for t in record["trials"] if t["backend"] == "onnx"] == [False, True]


def test_backend_auto_with_fp32_picks_between_the_fp32_runtimes_only(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backend=auto precision=fp32``: torch and ONNX Runtime fp32 compete, no lower precision does; the
    decision has its own key (next to ``precision=auto``'s), and a slowed torch loses to ONNX Runtime."""
    cache = tmp_path / "cache"
    real = real_build(bundle, cache)
    built: list[tuple[str, str]] = []

    def build(backend: str, precision: str) -> tuple[ServingTowers, str]:
        built.append((backend, precision))
        towers, described = real(backend, precision)
        if backend == "torch":  # clearly slower than any runtime, whatever this CPU's kernels
            towers.pooled = Slowed(towers.pooled, 0.05)  # type: ignore[arg-type,assignment]
        return towers, described

    towers, described = auto.fastest_towers(bundle, build, device="cpu", cache_root=cache, threads=1,
                                            precision="fp32", seconds=0.2)  # fmt: skip
    assert built == [("torch", "fp32"), ("onnx", "fp32")] == auto.candidates("cpu", "fp32")
    assert described.startswith("onnx fp32") and check_parity(bundle, towers.pooled) > 0.99999
    record = decision(cache, bundle)
    assert record["chosen"] == {"backend": "onnx", "precision": "fp32"}
    assert auto.decision_path(cache, bundle, "cpu", 1, "fp32") != auto.decision_path(cache, bundle, "cpu", 1)
    # Through select_towers, as the service calls it: the remembered fp32 winner is built without timing.
    towers, described = select_towers(bundle, backend="auto", precision="fp32", device="cpu",
                                      onnx_cache_root=cache, threads=1)  # fmt: skip
    assert described.startswith("onnx fp32") and "auto: remembered" in described


def test_backend_auto_with_bf16_builds_its_one_runtime_untimed(bundle: ModelBundle, tmp_path: Path) -> None:
    towers, described = select_towers(bundle, backend="auto", precision="bf16", device="cpu",
                                      onnx_cache_root=tmp_path, threads=1)  # fmt: skip
    assert described.startswith("torch bf16") and "auto:" not in described
    assert not (tmp_path / "auto").exists()  # nothing measured, nothing remembered
    assert check_parity(bundle, towers.pooled) >= PARITY_THRESHOLD


@pytest.mark.slow
def test_backend_auto_with_int8_times_both_int8_runtimes_and_without_onnxruntime_builds_torchs(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    towers, described = select_towers(bundle, backend="auto", precision="int8", device="cpu",
                                      onnx_cache_root=tmp_path / "a", threads=1)  # fmt: skip
    record = decision(tmp_path / "a", bundle)
    assert [(t["backend"], t["precision"]) for t in record["trials"]] == [("torch", "int8"), ("onnx", "int8")]
    assert described.startswith(f"{record['chosen']['backend']} int8") and "; auto: torch int8 " in described
    assert check_parity(bundle, towers.pooled) >= PARITY_THRESHOLD
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # a torch-only install: one int8 runtime, untimed
    towers, described = select_towers(bundle, backend="auto", precision="int8", device="cpu",
                                      onnx_cache_root=tmp_path / "b", threads=1)  # fmt: skip
    assert described.startswith("torch int8") and "auto:" not in described and not (tmp_path / "b").exists()


def test_backend_auto_with_int8_and_every_runtime_refused_is_a_backend_error(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parity, "check_parity", lambda bundle, towers: 0.98)
    with pytest.raises(BackendError, match=r"no int8 runtime passes for tiny@v1 \(torch int8: .*0\.980000 < 0\.999"):
        select_towers(bundle, backend="auto", precision="int8", device="cpu", onnx_cache_root=tmp_path, threads=1)


def test_candidates_follow_what_is_installed_and_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "has_native_bf16", lambda: False)
    every_runtime = [("torch", "int8"), ("onnx", "fp32"), ("onnx", "int8")]
    assert auto.candidates("cpu") == [("torch", "fp32"), *every_runtime]
    monkeypatch.setattr(auto, "has_native_bf16", lambda: True)
    assert auto.candidates("cpu") == [("torch", "fp32"), ("torch", "bf16"), *every_runtime]
    assert auto.candidates("cpu", "fp32") == [("torch", "fp32"), ("onnx", "fp32")]
    assert auto.candidates("cpu", "int8") == [("torch", "int8"), ("onnx", "int8")]  # torch's first: no export
    monkeypatch.setattr(auto, "has_int8_engine", lambda: False)  # a torch built without fbgemm / qnnpack
    assert ("torch", "int8") not in auto.candidates("cpu")
    monkeypatch.setattr(auto, "has_int8_engine", lambda: True)
    # int8 has no CUDA kernels; a CPU-only onnxruntime is no CUDA candidate.
    import onnxruntime

    cuda_candidates = [("torch", "fp32"), ("torch", "fp16"), ("torch-graphs", "fp16")]
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        cuda_candidates.append(("onnx", "fp32"))
    assert auto.candidates("cuda:1") == cuda_candidates
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # a torch-only install
    assert auto.candidates("cpu") == [("torch", "fp32"), ("torch", "bf16"), ("torch", "int8")]
    assert cpu.cpu_identity().endswith("no onnxruntime")


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) is needed to run the AVX2-only CPU path")
@pytest.mark.slow
def test_the_key_and_the_bf16_candidate_follow_the_cpu_that_runs(tmp_path: Path) -> None:
    """Under the emulated AVX2-only CPU the instruction sets are those it runs, not the host's
    /proc/cpuinfo (which qemu passes through): no AVX-512, no native bf16, another key."""
    script = (
        "import json; from clipcore.backends import cpu; print(json.dumps(sorted(cpu.cpu_features())))\n"
        "print(cpu.cpu_identity())"
    )
    proc = subprocess.run([str(QEMU), "-cpu", "EPYC-Milan", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    features_line, identity = proc.stdout.strip().splitlines()
    features = set(json.loads(features_line))
    assert "AVX2" in features and "AVX512F" not in features and cpu.NATIVE_BF16 not in features
    assert (identity == cpu.cpu_identity()) == (features == set(cpu.cpu_features()))


def test_a_crashing_candidate_or_a_garbled_decision_costs_only_that_candidate(
    bundle: ModelBundle, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    path = auto.decision_path(cache, bundle, "cpu", 1)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"chosen": {"backend": "torch", "precision": "int4"}}))  # no such candidate
    build = real_build(bundle, cache)

    def onnx_fp32_crashes(backend: str, precision: str) -> tuple[ServingTowers, str]:
        if (backend, precision) == ("onnx", "fp32"):
            raise RuntimeError("exporter crashed")
        return build(backend, precision)

    towers, described = auto.fastest_towers(bundle, onnx_fp32_crashes, device="cpu", cache_root=cache, threads=1,
                                            seconds=0.1)  # fmt: skip
    assert "auto: remembered in" not in described
    record = json.loads(path.read_text())
    (crashed,) = [t for t in record["trials"] if (t["backend"], t["precision"]) == ("onnx", "fp32")]
    assert crashed["refused"] == "RuntimeError: exporter crashed"
    assert check_parity(bundle, towers.pooled) >= PARITY_THRESHOLD
