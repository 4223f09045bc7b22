"""Re-timing a deferred ``auto`` decision under steady traffic: once no idle spell came within
``auto_retime_busy_after_s``, an attempt runs anyway, requests do not stop it, a version load does,
and its work is paced to ``auto_retime_busy_share`` of a core; with a share of 0 it waits for an
idle spell as before. The attempts are stand-ins and the timing's clock is scripted: nothing here
depends on how fast this machine is, and nothing asserts a duration."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from clipcore.backends import auto
from clipcore.backends.auto import Interrupted, Pace
from clipcore.backends.base import AutoDecision
from service.config import Settings
from service.runtime import retime
from service.runtime.metrics import ServiceMetrics
from service.runtime.retime import Pacer, Retimer

DEFERRED = AutoDecision("deferred", "torch", "fp32", 1.1, 0.18, 5, 1.0, "onnx int8 over torch fp32: 1.10x")


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"auto_retime_backoff_s": 0.0, "auto_retime_idle_s": 30.0,
                              "auto_retime_busy_after_s": 0.01, "auto_retime_busy_share": 0.25,
                              "torch_threads": 2, **overrides}  # fmt: skip
    return Settings(**values)


def serving() -> Any:
    return SimpleNamespace(auto=DEFERRED, bundle=SimpleNamespace(version="v1"), ref="tiny@v1")


class Waits:
    """The pauses a ``Pacer`` asked for (instead of sleeping them)."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> bool:
        self.asked.append(seconds)
        return False


def test_the_pacer_keeps_the_work_to_its_share_of_one_core() -> None:
    waits = Waits()
    pacer = Pacer(0.25, threads=2, wait=waits)
    for seconds in (0.1, 0.02, 0.5, 0.0):
        pacer(seconds)
    busy = 0.62
    assert pacer.busy_s == pytest.approx(busy) and pacer.cpu_s == pytest.approx(2 * busy)  # two threads at most
    # Each pause makes the work's CPU time (seconds x threads) a quarter of the time that passed.
    assert waits.asked == pytest.approx([0.7, 0.14, 3.5])  # seconds x (2 / 0.25 - 1); none for no work
    assert pacer.cpu_s / (pacer.busy_s + sum(waits.asked)) == pytest.approx(0.25)
    one_core = Pacer(1.0, threads=1, wait=waits)
    one_core(0.3)
    assert len(waits.asked) == 3  # a whole core for one thread: no pause
    with pytest.raises(ValueError, match="share of one core"):
        Pacer(0.0, threads=1, wait=waits)


class Clock:
    """``time.perf_counter`` for ``auto``: it moves only when an encoder runs or a pause is taken."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return 0.0


def test_time_rounds_paces_every_call_and_leaves_the_pauses_out_of_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(auto, "time", clock)
    calls: list[int] = []

    def encoder(batch: np.ndarray) -> np.ndarray:
        calls.append(len(batch))
        clock.now += len(batch) / 64  # binary fractions of a second: sums without rounding
        return np.zeros((len(batch), 4), dtype=np.float32)

    def timed(pace: Pace | None) -> list[list[dict[str, float]]]:
        calls.clear()
        return auto.time_rounds([encoder, encoder], 8, seconds=2.0, rounds=4, batch_sizes=(1, 8), pace=pace)

    unpaced = timed(None)
    unpaced_calls = list(calls)
    paced_work: list[float] = []

    def pace(seconds: float) -> None:
        paced_work.append(seconds)
        clock.now += seconds * 7  # a share of 1/4 on two threads

    paced = timed(pace)
    assert calls == unpaced_calls  # the same calls: the pauses took no call out of a slot
    assert paced == unpaced  # and the same figures
    assert len(paced_work) == len(calls)  # every call, warm-up ones included, was paced
    assert paced_work == [n / 64 for n in calls]
    assert calls.count(1) == 2 * (1 + 4 * 16)  # per encoder: a warm-up, then four 0.25 s slots of 1/64 s calls


async def run_retimer(rt: Retimer, timeout: float = 120.0) -> None:
    """Follow a deferred version and wait for the re-timing task to end (a bound, never asserted)."""
    rt.follow(serving())
    task = rt._task
    assert task is not None
    await asyncio.wait_for(task, timeout)


async def test_under_steady_traffic_a_deferred_decision_is_timed_anyway_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never idle: the attempt runs after ``auto_retime_busy_after_s``, with a pacer; a request
    arriving during it stops nothing; the pacer's pauses are waited for; the CPU counted is the
    pacing's bound, not the process's (which holds the requests')."""
    waits = Waits()
    monkeypatch.setattr(retime, "Pacer", lambda share, threads, wait: Pacer(share, threads, waits))
    seen: list[tuple[bool, Pacer | None]] = []
    rt: Retimer

    async def attempt(runtime: Any, interrupted: Interrupted, pace: Pace | None) -> retime.Result:
        rt.request_arrived()  # requests keep arriving
        assert isinstance(pace, Pacer)
        for _ in range(10):
            pace(0.01)  # ten timed calls of 10 ms
        seen.append((interrupted(), pace))
        return "chosen"

    rt = Retimer(settings(), ServiceMetrics(), "tiny", idle_since=lambda: None, attempt=attempt)
    await run_retimer(rt)
    assert rt.state is not None
    assert (rt.state.state, rt.state.last, rt.state.attempts, rt.state.paced, rt.state.interrupted) == (
        "decided", "chosen", 1, 1, 0,
    )  # fmt: skip
    ((stopped, pacer),) = seen
    assert stopped is False and pacer is not None
    assert waits.asked == pytest.approx([0.01 * (2 / 0.25 - 1)] * 10)
    work_cpu = 0.1 * 2  # 0.1 s of work on (at most) two threads
    assert rt.state.cpu_s == pytest.approx(work_cpu) == pacer.cpu_s
    assert work_cpu / (pacer.busy_s + sum(waits.asked)) == pytest.approx(0.25)


async def test_under_traffic_a_version_load_stops_the_timing_and_the_next_attempt_runs() -> None:
    loading = [False]
    asked: list[bool] = []

    async def attempt(runtime: Any, interrupted: Interrupted, pace: Pace | None) -> retime.Result:
        assert pace is not None
        asked.append(interrupted())
        if len(asked) == 1:
            loading[0] = True  # a version starts loading during the first attempt
            asked.append(interrupted())
            loading[0] = False
            raise auto.TimingInterrupted("a version loads")
        return "deferred"

    rt = Retimer(settings(auto_retime_attempts=1), ServiceMetrics(), "tiny", idle_since=lambda: None,
                 attempt=attempt, loading=lambda: loading[0])  # fmt: skip
    await run_retimer(rt)
    assert asked == [False, True, False]
    assert rt.state is not None and (rt.state.state, rt.state.interrupted, rt.state.paced) == ("exhausted", 1, 2)


async def test_an_idle_spell_still_times_unpaced_and_a_request_stops_it() -> None:
    idle: list[float | None] = [-1e9]  # idle for ages
    asked: list[tuple[bool, bool]] = []

    async def attempt(runtime: Any, interrupted: Interrupted, pace: Pace | None) -> retime.Result:
        asked.append((pace is None, interrupted()))
        idle[0] = None  # a request arrives
        asked.append((pace is None, interrupted()))
        return "chosen"

    rt = Retimer(settings(auto_retime_busy_after_s=3600.0), ServiceMetrics(), "tiny", idle_since=lambda: idle[0],
                 attempt=attempt)  # fmt: skip
    await run_retimer(rt)
    assert asked == [(True, False), (True, True)]
    assert rt.state is not None and rt.state.paced == 0


async def test_with_a_share_of_0_it_waits_for_an_idle_spell_however_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retime, "POLL_S", 0.001)
    polled = asyncio.Event()
    polls = [0]

    def never_idle() -> None:
        polls[0] += 1
        if polls[0] >= 50:  # well past auto_retime_busy_after_s's 0.01 s of polls
            polled.set()

    async def attempt(runtime: Any, interrupted: Interrupted, pace: Pace | None) -> retime.Result:
        raise AssertionError("re-timed under traffic with auto_retime_busy_share=0")

    rt = Retimer(settings(auto_retime_busy_share=0.0), ServiceMetrics(), "tiny", idle_since=never_idle,
                 attempt=attempt)  # fmt: skip
    rt.follow(serving())
    await asyncio.wait_for(polled.wait(), 120)
    assert rt.state is not None and (rt.state.state, rt.state.attempts, rt.state.paced) == ("waiting", 0, 0)
    await rt.close()
