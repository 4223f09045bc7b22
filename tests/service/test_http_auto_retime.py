"""A real server with ``CLIP_PRECISION=auto`` whose first measurement was unclear (deferred): it
measures again while idle, stops as soon as a request arrives (the request is answered, the
attempt is not counted), swaps the winner in once a measurement is clear without failing a
request, and gives up after ``auto_retime_attempts`` unclear attempts. Under steady traffic (no
idle spell long enough) it measures anyway after ``auto_retime_busy_after_s``, paced, and requests
do not stop it. A version decided locally
swaps to a decision ``clip-train tune`` shared in the store after it loaded.

The rounds' figures are scripted (``auto.time_rounds`` replaced): an unclear result (the candidate
faster in some rounds, not by its median), a clear one (twice as fast in every round), or the real
rounds, long enough that only a request ends them. Nothing asserts a duration."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from polling import wait_until
from prometheus_samples import metric_value

from clipcore.backends import auto, select
from clipcore.backends.tune import tune
from model_store import ModelStore

pytest.importorskip("onnxruntime")

CANDIDATES = [("torch", "fp32"), ("onnx", "fp32")]
UNCLEAR = [1.5, 0.8, 1.0, 1.2, 0.9]  # some rounds above 1.1, the median not: deferred
CLEAR = [2.0] * 5
REAL_TIME_ROUNDS = auto.time_rounds
WAIT_S = 240.0  # how long a state is waited for before the test fails (never asserted as a duration)


def _scripted(ratios: list[float]) -> Callable[..., Any]:
    """Rounds where the reference does 100 images/s and the other candidate ``ratios`` times that."""

    def figures(encoders: Any, image_size: int, seconds: float, rounds: int = auto.ROUNDS,
                batch_sizes: Any = auto.TIMED_BATCHES, interrupted: Any = None) -> Any:  # fmt: skip
        assert len(encoders) == 2 and rounds == len(ratios)
        return [
            [{str(b): 100.0 * (ratio if i else 1.0) for b in batch_sizes} for ratio in ratios]
            for i in range(len(encoders))
        ]

    return figures


class Script:
    """``auto.time_rounds`` answering with one step per call (the last repeats); counts its calls."""

    def __init__(self, *steps: Callable[..., Any]) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            step = self.steps[min(self.calls, len(self.steps) - 1)]
            self.calls += 1
        return step(*args, **kwargs)


@pytest.fixture
def server(tmp_path: Path, serve_app: Any, publish_model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    store_dir = tmp_path / "store"
    publish_model(store_dir, "tiny", seed=6)
    torch.set_num_threads(1)
    monkeypatch.setattr(auto, "candidates", lambda device, precision="auto": CANDIDATES)

    def start(script: Callable[..., Any], **overrides: Any) -> Any:
        monkeypatch.setattr(auto, "time_rounds", script)
        settings = {"store": str(store_dir), "model": "tiny@production", "precision": "auto", "torch_threads": 1,
                    "onnx_cache_dir": str(tmp_path / "cache"), "auto_retime_idle_s": 0.05,
                    "auto_retime_backoff_s": 0.0, **overrides}  # fmt: skip
        return serve_app(**settings)

    return start


def _auto(url: str) -> dict[str, Any]:
    (model,) = httpx.get(f"{url}/models", timeout=30).json()["models"]
    (serving,) = [v for v in model["versions"] if v["serving"]]
    return dict(serving["auto"])


def _wait_for(url: str, done: Callable[[dict[str, Any]], bool], name: str | None = None) -> dict[str, Any]:
    """The serving version's ``auto`` entry (of model ``name``; None: the only model) once ``done``."""
    seen: list[dict[str, Any]] = []

    def reached() -> bool:
        seen[:] = [_auto(url) if name is None else _model_auto(url, name)]
        return done(seen[0])

    wait_until(reached, timeout=WAIT_S, what="the auto entry's state")
    return seen[0]


def _retimes(url: str, result: str) -> float:
    return metric_value(url, "clip_backend_auto_retimes_total", model="tiny@production", result=result)


def _decisions(url: str, outcome: str) -> float:
    return metric_value(url, "clip_backend_auto_decisions_total", outcome=outcome)


@pytest.fixture
def traffic(make_image: Any) -> Iterator[Callable[[str], Callable[[], list[int]]]]:
    """``start(url)`` sends /embed requests from 4 threads until the returned ``stop()``, which
    gives every status code."""
    threads: list[threading.Thread] = []
    stopping = threading.Event()
    codes: list[int] = []
    body = {"images": [make_image("circle", "red")]}

    def send(url: str) -> None:
        with httpx.Client(timeout=120) as client:
            while not stopping.is_set():
                codes.append(client.post(f"{url}/embed", json=body).status_code)

    def start(url: str) -> Callable[[], list[int]]:
        threads.extend(threading.Thread(target=send, args=(url,), daemon=True) for _ in range(4))
        for thread in threads:
            thread.start()

        def stop() -> list[int]:
            stopping.set()
            for thread in threads:
                thread.join(timeout=120)
            return codes

        return stop

    yield start
    stopping.set()


@pytest.mark.slow
def test_a_deferred_decision_is_timed_again_while_idle_a_request_stops_it_and_the_winner_swaps_in(
    server: Any, make_image: Any, traffic: Any, tmp_path: Path
) -> None:
    timing, deciding, proceed = threading.Event(), threading.Event(), threading.Event()

    def until_a_request(encoders: Any, image_size: int, seconds: float, rounds: int = auto.ROUNDS,
                        batch_sizes: Any = auto.TIMED_BATCHES, interrupted: Any = None) -> Any:  # fmt: skip
        assert interrupted is not None  # only the load's measurement goes without it
        timing.set()
        # The real rounds, far longer than the test: only the request below ends them.
        return REAL_TIME_ROUNDS(encoders, image_size, 3600.0, rounds, batch_sizes, interrupted=interrupted)

    def clear_once_let_through(*args: Any, **kwargs: Any) -> Any:
        deciding.set()
        assert proceed.wait(WAIT_S)
        return _scripted(CLEAR)(*args, **kwargs)

    script = Script(_scripted(UNCLEAR), until_a_request, clear_once_let_through)
    with server(script) as running:
        url = running.url
        assert _auto(url)["outcome"] == "deferred"
        assert timing.wait(WAIT_S), "re-timing did not start while idle"

        # A request during the re-timing is answered, and the timing stops for it (not counted).
        answer = httpx.post(f"{url}/embed", json={"images": [make_image("circle", "red")]}, timeout=120)
        assert answer.status_code == 200, answer.text
        stopped = _wait_for(url, lambda d: d["retime"]["interrupted"] >= 1)
        assert stopped["retime"]["attempts"] == 0 and stopped["outcome"] == "deferred", stopped
        assert _retimes(url, "interrupted") == 1

        # The next idle spell measures clearly; requests in flight while the winner swaps in all succeed.
        assert deciding.wait(WAIT_S), "re-timing did not resume once idle again"
        stop = traffic(url)
        proceed.set()
        decided = _wait_for(url, lambda d: d["outcome"] == "chosen")
        codes = stop()
        assert codes and set(codes) == {200}, sorted(set(codes))

        assert (decided["backend"], decided["precision"]) == ("onnx", "fp32"), decided
        assert decided["margin"] == pytest.approx(2.0)
        retime = decided["retime"]
        assert retime["state"] == "decided" and retime["last"] == "chosen", retime
        assert retime["attempts"] == 1 and retime["interrupted"] == 1 and retime["at"] is not None, retime
        assert script.calls == 3
        assert _retimes(url, "chosen") == 1
        assert _decisions(url, "deferred") == 1 and _decisions(url, "chosen") == 1
        assert metric_value(url, "clip_model_swaps_total", model="tiny@production", result="ok") == 1
        assert "onnx" in running.services.manager.current.backend
        answer = httpx.post(f"{url}/embed", json={"images": [make_image("circle", "red")]}, timeout=120)
        assert answer.status_code == 200, answer.text

    # Kept in the decision file like a decision taken at a load: the next start builds the winner.
    (kept,) = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "auto" / "tiny").glob("*.json")]
    assert kept["chosen"] == {"backend": "onnx", "precision": "fp32"}, kept


@pytest.mark.slow
def test_under_steady_traffic_a_deferred_decision_is_timed_anyway_paced_and_the_winner_swaps_in(
    server: Any, make_image: Any, traffic: Any
) -> None:
    """No idle spell ever lasts ``auto_retime_idle_s`` (longer than the machine has been up: before
    its first request a server counts as idle since the clock's start): after
    ``auto_retime_busy_after_s`` the attempt runs under the traffic, paced; a request during it is
    answered and stops nothing."""
    timing, proceed = threading.Event(), threading.Event()
    asked: list[bool] = []

    def paced_clear(encoders: Any, image_size: int, seconds: float, rounds: int = auto.ROUNDS,
                    batch_sizes: Any = auto.TIMED_BATCHES, interrupted: Any = None,
                    pace: Any = None) -> Any:  # fmt: skip
        assert interrupted is not None and pace is not None  # under traffic: paced
        timing.set()
        assert proceed.wait(WAIT_S)
        asked.append(interrupted())
        pace(0.001)  # a timed call's worth of work: the pause is taken, nothing fails
        return _scripted(CLEAR)(encoders, image_size, seconds, rounds, batch_sizes)

    script = Script(_scripted(UNCLEAR), paced_clear)
    with server(script, auto_retime_idle_s=1e9, auto_retime_busy_after_s=0.05) as running:
        url = running.url
        assert _auto(url)["outcome"] == "deferred"
        stop = traffic(url)
        assert timing.wait(WAIT_S), "re-timing did not start under the traffic"
        answer = httpx.post(f"{url}/embed", json={"images": [make_image("circle", "red")]}, timeout=120)
        assert answer.status_code == 200, answer.text
        during = _auto(url)["retime"]
        assert (during["state"], during["paced"], during["interrupted"]) == ("timing", 1, 0), during
        proceed.set()
        decided = _wait_for(url, lambda d: d["outcome"] == "chosen")
        codes = stop()
        assert codes and set(codes) == {200}, sorted(set(codes))
        assert asked == [False]  # requests in flight did not stop it
        assert (decided["backend"], decided["precision"]) == ("onnx", "fp32"), decided
        retime = decided["retime"]
        assert (retime["state"], retime["attempts"], retime["paced"], retime["interrupted"]) == ("decided", 1, 1, 0)
        assert script.calls == 2 and _retimes(url, "chosen") == 1


def test_re_timing_stops_after_the_set_number_of_unclear_attempts(server: Any) -> None:
    script = Script(_scripted(UNCLEAR))
    with server(script, auto_retime_attempts=2) as running:
        url = running.url
        done = _wait_for(url, lambda d: d["retime"]["state"] == "exhausted")
        assert done["outcome"] == "deferred" and done["backend"] == "torch", done
        retime = done["retime"]
        assert retime["attempts"] == 2 == retime["max_attempts"] and retime["last"] == "deferred", retime
        assert script.calls == 3  # the load's measurement and two re-timings, no more
        assert _retimes(url, "deferred") == 2 and _decisions(url, "deferred") == 3
        assert metric_value(url, "clip_model_swaps_total", model="tiny@production", result="ok") == 0


def test_re_timing_can_be_turned_off(server: Any) -> None:
    with server(Script(_scripted(UNCLEAR)), auto_retime_attempts=0) as running:
        decision = _auto(running.url)
        assert decision["outcome"] == "deferred" and decision["retime"] is None, decision


def test_a_decision_shared_after_the_load_replaces_the_local_one_while_idle(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_image: Any
) -> None:
    monkeypatch.setattr(auto, "time_rounds", Script(_scripted(CLEAR)))
    tuned = tune(ModelStore(tmp_path / "store"), "tiny@production", threads=1, seconds=0.2)
    assert (tuned.decision.backend, tuned.written.meta["outcome"]) == ("onnx", "shared")
    real_adopt = select.adopt_shared
    looked_up: list[bool] = []

    def absent_at_the_load(*args: Any, **kwargs: Any) -> Any:
        looked_up.append(True)  # the load looks first: the store had nothing for it yet
        return None if len(looked_up) == 1 else real_adopt(*args, **kwargs)

    monkeypatch.setattr(select, "adopt_shared", absent_at_the_load)
    not_faster = Script(_scripted([1.0] * 5))
    with server(not_faster) as running:
        url = running.url
        done = _wait_for(url, lambda d: d["outcome"] == "shared")
        assert (done["backend"], done["precision"]) == ("onnx", "fp32"), done
        assert done["decision"].startswith("shared (tuned on"), done
        retime = done["retime"]
        assert retime["mode"] == "shared" and retime["state"] == "decided" and retime["last"] == "shared", retime
        assert not_faster.calls == 1  # the load timed; the re-timing only read the store
        assert _retimes(url, "shared") == 1 and _decisions(url, "shared") == 1 and _decisions(url, "chosen") == 1
        assert metric_value(url, "clip_model_swaps_total", model="tiny@production", result="ok") == 1
        answer = httpx.post(f"{url}/embed", json={"images": [make_image("circle", "red")]}, timeout=120)
        assert answer.status_code == 200, answer.text


def test_re_timing_stops_once_its_cpu_budget_is_spent(server: Any) -> None:
    script = Script(_scripted(UNCLEAR))
    with server(script, auto_retime_attempts=5, auto_retime_cpu_s=1e-9) as running:
        done = _wait_for(running.url, lambda d: d["retime"]["state"] == "budget spent")
        retime = done["retime"]
        assert retime["attempts"] == 1 and retime["cpu_s"] > 0, retime  # one attempt spends it
        assert script.calls == 2 and done["outcome"] == "deferred", done


def test_in_a_served_set_the_entries_take_turns_and_a_request_for_another_model_stops_the_timing(
    server: Any, tmp_path: Path, publish_model: Any, make_image: Any
) -> None:
    publish_model(tmp_path / "store", "other", seed=7)
    timing = threading.Event()
    retimes: list[bool] = []

    def rounds(encoders: Any, image_size: int, seconds: float, rounds: int = auto.ROUNDS,
               batch_sizes: Any = auto.TIMED_BATCHES, interrupted: Any = None) -> Any:  # fmt: skip
        if interrupted is None or retimes:  # the loads' measurements, and re-timings after the first
            return _scripted(UNCLEAR)(encoders, image_size, seconds, rounds, batch_sizes)
        retimes.append(True)
        timing.set()
        return REAL_TIME_ROUNDS(encoders, image_size, 3600.0, rounds, batch_sizes, interrupted=interrupted)

    with server(rounds, model="tiny@production,other@production") as running:
        url = running.url
        assert timing.wait(WAIT_S), "re-timing did not start while idle"
        states = {name: _model_auto(url, name)["retime"] for name in ("tiny", "other")}
        (timed,) = [name for name, state in states.items() if state["state"] == "timing"]
        (other,) = [name for name in states if name != timed]
        assert states[other]["state"] == "waiting", states  # one entry re-times at a time

        answer = httpx.post(f"{url}/embed", json={"model": other, "images": [make_image("circle", "red")]}, timeout=120)
        assert answer.status_code == 200, answer.text
        stopped = _wait_for(url, lambda d: d["retime"]["interrupted"] >= 1, name=timed)
        assert stopped["retime"]["attempts"] == 0, stopped


def _model_auto(url: str, name: str) -> dict[str, Any]:
    model = httpx.get(f"{url}/models/{name}", timeout=30).json()
    (serving,) = [v for v in model["versions"] if v["serving"]]
    return dict(serving["auto"])
