"""``precision=auto`` beside processes spinning on the same cores: the decision is the one a quiet
measurement takes, or deferred (the reference serves, nothing is kept), never another winner.

Candidates with known speeds are stand-ins that spin the interpreter for a fixed number of
iterations per image (CPU work that other processes slow down like real kernels); the noise is
``python -c "while True: pass"`` processes started and stopped by the test, either for the whole
trials or as a burst that arrives or leaves while one candidate is being timed (what a pod that
wakes up on the node does to a sequential measurement). One run uses the tiny model's real
candidates. Nothing asserts an absolute speed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clipcore.backends import auto
from clipcore.backends.base import ServingTowers
from clipcore.backends.select import select_towers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

ITERATIONS_PER_UNIT = 50_000  # about 1 ms of interpreter work: calls longer than a time slice
BURNERS = 3  # with this process, 4 runnable on 2 cores: about half the CPU time each
CANDIDATES = [("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, publish_model: Any) -> ModelBundle:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("noise-store")
    publish_model(root, "tiny", seed=5)
    return ModelBundle.load(ModelStore(root), "tiny@production")


class Burner:
    """``BURNERS`` processes spinning at full speed until ``stop``."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        if not self.procs:
            self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs = []


@pytest.fixture
def burner() -> Iterator[Burner]:
    b = Burner()
    try:
        yield b
    finally:
        b.stop()


class Spinner:
    """Image towers whose cost is ``units`` of interpreter work per image; ``on_timed`` runs at the
    first call after the two warm-up calls (batch 1 and 8), i.e. when this candidate's timing starts."""

    def __init__(self, bundle: ModelBundle, units: int, on_timed: Callable[[], None] | None = None) -> None:
        self.dim, self.units, self.on_timed, self.calls = bundle.embed_dim, units, on_timed, 0

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == 3 and self.on_timed is not None:
            self.on_timed()
        for _ in range(self.units * ITERATIONS_PER_UNIT * len(pixels)):
            pass
        return np.zeros((len(pixels), self.dim), dtype=np.float32)


def outcome(towers: ServingTowers, described: str) -> tuple[str, tuple[str, str]]:
    """("chosen" or "deferred", what serves)."""
    decision = getattr(towers, "auto", None)
    if decision is None:  # a selection that records no decision (the sequential one before): what serves
        backend, precision = described.split(";")[0].split()[:2]
        return "chosen", (backend, precision)
    return decision.outcome, (decision.backend, decision.precision)


Hooks = dict[tuple[str, str], Callable[[], None]]


def choose(
    bundle: ModelBundle, cache: Path, units: dict[tuple[str, str], int], hooks: Hooks
) -> tuple[str, tuple[str, str]]:
    def build(backend: str, precision: str) -> tuple[ServingTowers, str]:
        spinner = Spinner(bundle, units[(backend, precision)], hooks.get((backend, precision)))
        return ServingTowers(bundle, spinner), f"{backend} {precision}"  # type: ignore[arg-type]

    shutil.rmtree(cache, ignore_errors=True)  # nothing remembered: every call measures
    # The service's own timing on a CPU (1 s per candidate, seconds=None): a fifth of it leaves one
    # call of batch 8 per slot, whose time one descheduling decides, and equal candidates then pass
    # for 1.1x now and then.
    towers, described = auto.fastest_towers(bundle, build, device="cpu", cache_root=cache, threads=1)
    return outcome(towers, described)


@pytest.mark.parametrize("noise", ["steady", "burst on the fastest", "burst on the reference"])
@pytest.mark.slow
def test_noise_never_picks_another_winner_than_a_quiet_measurement(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, burner: Burner, noise: str
) -> None:
    """Reference 6 units, ONNX fp32 3, ONNX int8 2 per image: int8 is 1.5x the runner-up by
    construction. A burst that slows int8's timing by half hides that from a sequential measurement."""
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": CANDIDATES)
    units = {CANDIDATES[0]: 6, CANDIDATES[1]: 3, CANDIDATES[2]: 2}
    quiet = choose(bundle, tmp_path, units, {})
    assert quiet in {("chosen", ("onnx", "int8")), ("deferred", ("torch", "fp32"))}

    hooks: Hooks = {}
    if noise == "steady":
        burner.start()
    elif noise == "burst on the fastest":  # arrives when int8's timing starts, stays to the end
        hooks[CANDIDATES[2]] = burner.start
    else:  # arrives with the reference's timing, leaves when the next candidate's starts
        hooks = {CANDIDATES[0]: burner.start, CANDIDATES[1]: burner.stop}
    noisy = choose(bundle, tmp_path, units, hooks)
    burner.stop()
    assert noisy in {("chosen", ("onnx", "int8")), ("deferred", ("torch", "fp32"))}, noisy
    if noisy[0] == "deferred":
        record = json.loads(next((tmp_path / "auto").rglob("*.json")).read_text())
        assert "chosen" not in record and record["decision"]["reason"]  # nothing kept: measured again next load


@pytest.mark.parametrize("noise", ["steady", "burst on the reference"])
def test_equal_candidates_keep_the_reference_or_defer_under_noise(
    bundle: ModelBundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, burner: Burner, noise: str
) -> None:
    """Three candidates of the same cost: nothing may replace the reference, whatever the noise."""
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": CANDIDATES)
    units = dict.fromkeys(CANDIDATES, 3)
    hooks: Hooks = {}
    if noise == "steady":
        burner.start()
    else:  # the reference is timed while the cores are busy, the others on quiet cores
        hooks = {CANDIDATES[0]: burner.start, CANDIDATES[1]: burner.stop}
    noisy = choose(bundle, tmp_path, units, hooks)
    burner.stop()
    assert noisy[1] == ("torch", "fp32"), noisy


@pytest.mark.slow
def test_the_tiny_models_real_candidates_beside_a_burner(bundle: ModelBundle, tmp_path: Path, burner: Burner) -> None:
    """The real candidates (exports made once, then only timed): a decision taken beside spinning
    processes is the quiet one or deferred."""
    cache = tmp_path / "cache"

    def decide() -> tuple[str, tuple[str, str]]:
        shutil.rmtree(cache / "auto", ignore_errors=True)  # keep the exports, forget the decision
        towers, described = select_towers(bundle, backend="torch", precision="auto", device="cpu",
                                          onnx_cache_root=cache, threads=1)  # fmt: skip
        return outcome(towers, described)

    quiet = decide()
    burner.start()
    noisy = decide()
    burner.stop()
    if quiet[0] == "chosen" and noisy[0] == "chosen":
        assert noisy == quiet
    if noisy[0] == "deferred":
        assert noisy[1] == auto.REFERENCE
