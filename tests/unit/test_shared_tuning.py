"""``clip-train tune`` on the tiny model into a real store (a directory, and a real S3 server): the
decision and the winner's graphs are written as an artifact set keyed by the CPU kind and the
settings, and a later load with ``auto`` uses them, copying the graphs and timing nothing; where
the key differs (another CPU kind, other settings) the load decides locally.

The rounds run for real but their figures are scripted (``scripted_timings``): the winner is an
ONNX runtime, with graphs to share, whatever this machine's noise or its int8 kernels say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from scripted_timings import REAL_TIME_ROUNDS, onnx_scripted_to_win
from typer.testing import CliRunner

from clipcore.backends import auto, shared
from clipcore.backends.onnx_export import SIDECAR
from clipcore.backends.parity import PARITY_THRESHOLD, check_parity
from clipcore.backends.select import select_towers
from clipcore.backends.tune import TuneError, tune
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore

pytestmark = pytest.mark.slow


def must_not_time(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a shared decision was timed again")


def tuned_store(location: str, publish_model: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelStore, Any]:
    torch.set_num_threads(1)
    publish_model(location, "tiny", seed=3)
    store = ModelStore(location)
    monkeypatch.setattr(auto, "time_rounds", onnx_scripted_to_win)
    done = tune(store, "tiny@production", threads=1, seconds=0.2)
    monkeypatch.setattr(auto, "time_rounds", must_not_time)
    return store, done


def load_auto(store: ModelStore, cache: Path) -> tuple[Any, str]:
    bundle = ModelBundle.load(store, "tiny@production")
    return select_towers(bundle, backend="torch", precision="auto", device="cpu", onnx_cache_root=cache, threads=1,
                         store=store)  # fmt: skip


def test_a_tuned_decision_is_used_with_its_graphs_and_nothing_is_timed(
    tmp_path: Path, publish_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, done = tuned_store(str(tmp_path / "store"), publish_model, monkeypatch)
    key, parts = shared.shared_key("cpu", 1, "auto")
    written = done.written
    assert written.key == key and store.artifact_keys("tiny", "v1") == [key]
    assert done.decision.outcome == "chosen" and done.decision.backend == "onnx"
    assert SIDECAR in written.files and "image.onnx" in written.files
    assert written.meta["key_parts"] == parts and written.meta["tuned_on"]
    assert {(t["backend"], t["precision"]) for t in written.meta["trials"]} == set(auto.candidates("cpu"))

    cache = tmp_path / "pod-cache"
    towers, described = load_auto(store, cache)
    decision = towers.auto
    assert decision.outcome == "shared" and (decision.backend, decision.precision) == ("onnx", done.decision.precision)
    assert decision.provenance.startswith(f"shared (tuned on {written.meta['tuned_on']} at ")
    assert decision.margin == pytest.approx(done.decision.margin) and decision.rounds == done.decision.rounds
    assert f"decision: {decision.provenance}" in described
    assert not (cache / "auto").exists()  # nothing decided here
    (export,) = [p for p in (cache / "tiny").iterdir() if p.is_dir()]
    assert {p.name for p in export.iterdir()} >= set(written.files)
    assert check_parity(towers.bundle, towers.pooled) >= PARITY_THRESHOLD

    # A restart on the same node finds the graphs in place: the set is read, nothing copied again.
    before = {p.name: p.stat().st_ino for p in export.iterdir()}
    again, _ = load_auto(store, cache)
    assert again.auto.outcome == "shared" and {p.name: p.stat().st_ino for p in export.iterdir()} == before


def test_another_cpu_kind_or_other_settings_decide_locally(
    tmp_path: Path, publish_model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store, done = tuned_store(str(tmp_path / "store"), publish_model, monkeypatch)
    monkeypatch.setattr(shared, "cpu_kind", lambda: "x86_64-avx2-fma-torch.avx2")  # a node of another kind
    with pytest.raises(AssertionError, match="timed again"), caplog.at_level("INFO", logger="clipcore.backends"):
        load_auto(store, tmp_path / "cache")
    assert f"the store has decisions for {done.written.key}" in caplog.text and "decision: local" in caplog.text

    monkeypatch.setattr(auto, "time_rounds", REAL_TIME_ROUNDS)
    towers, described = load_auto(store, tmp_path / "cache")
    assert towers.auto.outcome in ("chosen", "deferred") and towers.auto.provenance == "local"
    assert described.endswith("decision: local")


def test_a_tuned_set_whose_graphs_were_damaged_falls_back_to_local(
    tmp_path: Path, publish_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, done = tuned_store(str(tmp_path / "store"), publish_model, monkeypatch)
    s = done.written
    (tmp_path / "store" / "tiny" / "artifacts" / "v1" / s.key / s.folder / "image.onnx").write_bytes(b"not a graph")
    with pytest.raises(AssertionError, match="timed again"):
        load_auto(store, tmp_path / "cache")


def test_tune_through_s3(s3_env: Any, tmp_path: Path, publish_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store, done = tuned_store(s3_env.new_location(), publish_model, monkeypatch)
    towers, _ = load_auto(store, tmp_path / "cache")
    assert towers.auto.outcome == "shared" and towers.auto.backend == "onnx"
    assert check_parity(towers.bundle, towers.pooled) >= PARITY_THRESHOLD


def test_the_command_line_tunes_and_says_what_it_shared(
    tmp_path: Path, publish_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.cli import app

    publish_model(tmp_path / "store", "tiny", seed=3)
    monkeypatch.setattr(auto, "time_rounds", onnx_scripted_to_win)
    result = CliRunner().invoke(app, ["tune", "tiny@production", "--store", str(tmp_path / "store"),
                                      "--threads", "1", "--seconds", "0.2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        "tuned tiny@v1 on " in result.output and f"shared as {shared.shared_key('cpu', 1, 'auto')[0]}" in result.output
    )
    # bf16 runs on torch only: nothing to compare, nothing written; --no-fail exits 0 all the same
    # (the training Job's promote still runs).
    with pytest.raises(TuneError, match="nothing to tune"):
        tune(ModelStore(tmp_path / "store"), "tiny@production", threads=1, precision="bf16")
    args = ["tune", "tiny@production", "--store", str(tmp_path / "store"), "--threads", "1", "--precision", "bf16"]
    assert CliRunner().invoke(app, args).exit_code == 1
    result = CliRunner().invoke(app, [*args, "--no-fail"])
    assert result.exit_code == 0 and "nothing to tune" in result.output
