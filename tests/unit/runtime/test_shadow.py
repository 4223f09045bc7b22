"""Shadow comparisons and the shadow runner's queue, without a server: what is compared, what is
dropped (a full queue, busy serving versions, a shadow gone), and the caller key canaries route by."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from service.runtime import ServiceMetrics
from service.runtime.canary import caller_key
from service.runtime.shadow import Answer, ShadowJob, ShadowRunner, TrafficGaps, compare, mean_cosine, pearson


def test_a_copy_agrees_on_everything() -> None:
    vectors = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    answer = Answer(decisions=("red", "blue"), vectors=vectors, scores=(0.1, 0.5, 0.2))
    c = compare(answer, answer)
    assert (c.agree, c.disagree) == (2, 0)
    assert c.cosine == pytest.approx(1.0) and c.correlation == pytest.approx(1.0)


def test_decisions_are_compared_one_by_one() -> None:
    c = compare(Answer(decisions=("a", "b", "a")), Answer(decisions=("a", "a", "a")))
    assert (c.agree, c.disagree, c.cosine, c.correlation) == (2, 1, None, None)
    with pytest.raises(ValueError):
        compare(Answer(decisions=("a",)), Answer(decisions=("a", "b")))


def test_cosine_and_correlation() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert mean_cosine(a, np.array([[1.0, 0.0], [0.0, -1.0]])) == pytest.approx(0.0)
    assert mean_cosine(a, 3 * a) == pytest.approx(1.0)  # scale does not matter
    assert mean_cosine(np.zeros((1, 2)), np.ones((1, 2))) == 0.0  # a zero row counts as 0, not NaN
    assert pearson((1.0, 2.0, 3.0), (2.0, 4.0, 6.5)) == pytest.approx(np.corrcoef([1, 2, 3], [2, 4, 6.5])[0, 1])
    assert pearson((1.0, 2.0, 3.0), (3.0, 2.0, 1.0)) == pytest.approx(-1.0)
    assert pearson((1.0, 1.0), (1.0, 2.0)) is None  # constant scores: undefined
    assert pearson((1.0,), (1.0,)) is None


class FakeRuntime:
    """What the runner touches of a runtime: ``held`` counts users."""

    def __init__(self) -> None:
        self.active = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[FakeRuntime]:
        self.active += 1
        try:
            yield self
        finally:
            self.active -= 1


def runner(metrics: ServiceMetrics, *, busy: bool = False, runtime: Any = None, capacity: int = 2) -> ShadowRunner:
    shadow = runtime if runtime is not None else FakeRuntime()
    return ShadowRunner("m", metrics, lease=lambda v: shadow if v == "v2" else None, busy=lambda: busy,
                        capacity=capacity)  # fmt: skip


def job(answer: str, shadow_answer: str, version: str = "v2") -> ShadowJob[str]:
    async def rerun(_: Any) -> str:
        return shadow_answer

    return ShadowJob(version, "/classify", answer, rerun, lambda a: Answer(decisions=tuple(a)))


def outcome(metrics: ServiceMetrics, outcome: str, version: str = "v2") -> float:
    labels = {"model": "m", "version": version, "endpoint": "/classify", "outcome": outcome}
    return metrics.registry.get_sample_value("clip_shadow_requests_total", labels) or 0.0


def test_the_runner_compares_and_counts() -> None:
    metrics = ServiceMetrics()
    shadow = FakeRuntime()
    r = runner(metrics, runtime=shadow)
    asyncio.run(r.run(job("aab", "abb")))
    stats = r.summary("v2")["/classify"]
    assert (stats.compared, stats.agree, stats.disagree, stats.agreement) == (1, 2, 1, pytest.approx(2 / 3))
    assert outcome(metrics, "compared") == 1 and shadow.active == 0
    get = metrics.registry.get_sample_value
    labels = {"model": "m", "version": "v2", "endpoint": "/classify"}
    assert get("clip_shadow_agreement_total", {**labels, "result": "disagree"}) == 1
    r.forget("v2")
    assert r.summary("v2") == {}


def test_a_full_queue_drops_the_offer() -> None:
    metrics = ServiceMetrics()
    r = runner(metrics, capacity=2)  # not started: nothing drains the queue

    async def offer_three() -> None:
        for _ in range(3):
            await r.offer(job("a", "a"))

    asyncio.run(offer_three())
    assert r.pending == 2 and outcome(metrics, "queue_full") == 1
    assert r.summary("v2")["/classify"].dropped == 1


def test_busy_serving_versions_and_a_shadow_gone_drop_the_run() -> None:
    metrics = ServiceMetrics()
    asyncio.run(runner(metrics, busy=True).run(job("a", "a")))
    assert outcome(metrics, "busy") == 1
    asyncio.run(runner(metrics).run(job("a", "a", version="v3")))  # the shadow is v2 now
    assert outcome(metrics, "gone", version="v3") == 1
    assert outcome(metrics, "compared") == 0


def test_a_failed_shadow_run_is_counted_not_raised() -> None:
    metrics = ServiceMetrics()

    async def refuse(_: Any) -> str:
        raise RuntimeError("queue full")

    r = runner(metrics)
    asyncio.run(r.run(ShadowJob("v2", "/classify", "a", refuse, lambda a: Answer(decisions=tuple(a)))))
    assert outcome(metrics, "failed") == 1 and r.summary("v2")["/classify"].failed == 1


def test_the_worker_runs_queued_jobs_after_start() -> None:
    metrics = ServiceMetrics()
    r = runner(metrics, capacity=4)

    async def scenario() -> None:
        await r.start()
        for _ in range(3):
            await r.offer(job("ab", "ab"))
        for _ in range(100):
            if outcome(metrics, "compared") == 3:
                break
            await asyncio.sleep(0.01)
        await r.close()

    asyncio.run(scenario())
    assert outcome(metrics, "compared") == 3 and r.summary("v2")["/classify"].agreement == 1.0


def test_the_caller_key_is_the_canary_key_else_a_digest_of_the_api_key() -> None:
    assert caller_key("user-42", "Bearer secret") == b"user-42"
    digest = caller_key(None, "Bearer secret")
    assert digest is not None and len(digest) == 32 and b"secret" not in digest
    assert digest != hashlib.sha256(b"secret").digest()  # salted: not the plain digest of the key
    assert caller_key(None, "bearer  secret ") == digest
    assert caller_key("", "Bearer other") != digest
    assert caller_key(None, None) is None and caller_key(None, "Basic abc") is None and caller_key("", "") is None


def test_a_run_waits_for_a_gap_in_the_traffic_and_is_dropped_without_one() -> None:
    metrics = ServiceMetrics()
    in_flight: dict[str, float | None] = {"since": None}  # None: a request is in flight on the answering versions

    r = ShadowRunner("m", metrics, lease=lambda v: FakeRuntime(), busy=lambda: False,
                     idle_since=lambda: in_flight["since"], quiet_s=0.02, wait_s=0.2)  # fmt: skip

    async def scenario() -> tuple[bool, bool, float]:
        loop_start = time.monotonic()
        no_gap = await r.until_quiet()  # requests in flight the whole time: gives up after wait_s
        waited = time.monotonic() - loop_start
        in_flight["since"] = time.monotonic()  # the last request just ended
        gap = await r.until_quiet()  # a gap of quiet_s follows
        return no_gap, gap, waited

    no_gap, gap, waited = asyncio.run(scenario())
    assert (no_gap, gap) == (False, True) and waited >= 0.1

    async def dropped_as_busy() -> None:
        in_flight["since"] = None
        await r.start()
        await r.offer(job("a", "a"))
        for _ in range(200):
            if outcome(metrics, "busy") == 1:
                break
            await asyncio.sleep(0.01)
        await r.close()

    asyncio.run(dropped_as_busy())
    assert outcome(metrics, "busy") == 1 and outcome(metrics, "compared") == 0


def test_traffic_gaps_say_whether_a_run_would_end_before_the_next_request() -> None:
    gaps = TrafficGaps()
    assert gaps.fits(0.005, 0.006)  # nothing learnt yet: the quiet period alone decides
    for i in range(100):  # a client sending back to back: gaps of 2 to 8 ms
        gaps.add(0.002 + 0.006 * i / 99)
    assert not gaps.fits(0.005, 0.006)  # every gap that lasted 5 ms ended within 3 ms more
    assert gaps.fits(0.009, 0.006)  # longer than any it ever paused: its next request is not near
    assert gaps.fits(0.005, 0.0)  # a run of no length fits any gap

    paced = TrafficGaps()
    for _ in range(50):  # a client that pauses 20 ms, and short gaps between batches of another
        paced.add(0.020)
        paced.add(0.001)
    assert paced.fits(0.005, 0.006)  # a gap that lasted 5 ms is one of the 20 ms ones
    assert not paced.fits(0.005, 0.016)


def test_a_run_waits_past_the_gaps_that_would_end_before_it_does() -> None:
    in_flight: dict[str, float | None] = {"since": None}
    r = ShadowRunner("m", ServiceMetrics(), lease=lambda v: FakeRuntime(), busy=lambda: False,
                     idle_since=lambda: in_flight["since"], quiet_s=0.005, wait_s=1.0)  # fmt: skip
    for _ in range(50):
        r.note_gap(0.05)  # the traffic's gaps all end after 50 ms
    r._run_length.add(0.06)  # and a run takes 60 ms: none of those gaps could hold one

    async def waited() -> tuple[bool, float]:
        start = in_flight["since"] = time.monotonic()
        started = await r.until_quiet()
        return started, time.monotonic() - start

    started, seconds = asyncio.run(waited())
    assert started and seconds >= 0.05  # not at 5 ms: only once the gap outlasted the traffic's usual ones
