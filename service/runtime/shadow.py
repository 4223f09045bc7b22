"""Shadow runs: a sample of the requests re-run on a shadow version after they were answered.

The HTTP layer hands a sampled request over (``ShadowRunner.offer``) once the primary's answer
has been sent, so the shadow never delays it; the shadow's answer is only compared, never
returned. Shadow work is the first thing dropped under load: the queue holds a few requests (an
offer beyond them is dropped), one worker runs them one at a time, and a request is dropped
when its turn comes while the batchers of the versions that answer callers have work queued.

Shadow work also waits for idle time: a run starts only once the versions that answer callers
have had no request in flight for ``quiet_s`` (the ``shadow_quiet_ms`` setting), and a sampled
request that finds no such moment within ``SHADOW_WAIT_S`` is dropped (``busy``). Started right
after an answer, a run would share the CPU with the next request of a busy client (back-to-back
requests leave gaps of a millisecond or so); so it runs in the gaps of the traffic instead, and
under steady load, where there are none, it gives way entirely. How long a gap must last is learnt
from the traffic (``TrafficGaps``): a run starts once most of the recent gaps that lasted as long
as this one went on long enough to hold a run of the length the last runs took. A client that
pauses 20 ms between requests gets its shadow runs after 5 ms; one whose requests follow each other
within a few milliseconds only in the rare longer pauses of its traffic.

A shadow run calls the request's own operation with the shadow version's runtime, through the
same pipeline (cache, batchers), and compares the two answers (``compare``): decisions one by one
(top-1 label, pair decision, best caption), embeddings by mean cosine, scores by Pearson
correlation. Results go to Prometheus (``shadow_*``) and to a summary per version and endpoint
(``ShadowRunner.summary``) that GET /models/{name} shows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime
from service.runtime.pipeline import REQUEST_STAGES, RequestStages

__all__ = [
    "SHADOW_QUEUE",
    "Answer",
    "Comparison",
    "EndpointStats",
    "ShadowJob",
    "ShadowRunner",
    "TrafficGaps",
    "compare",
]

log = logging.getLogger("service.shadow")
A = TypeVar("A")

# Sampled requests waiting for the shadow: a few cover the gaps between requests of a steady load;
# more would only be shadow work piling up behind itself (dropped instead, and counted).
SHADOW_QUEUE = 4
# A gap in the traffic, not the moment between an answer and the next request of the same client
# (the default of the shadow_quiet_ms setting).
SHADOW_QUIET_S = 0.005
SHADOW_WAIT_S = 1.0  # how long a sampled request waits for such a gap before it is dropped
# The gaps between requests that TrafficGaps remembers: a few seconds of a busy client's traffic.
GAP_HISTORY = 256
# Fewer past gaps than this as long as the current one: the traffic has paused longer than it
# usually does, and nothing it did says the next request is near.
GAP_EVIDENCE = 16
FIT_SHARE = 0.9  # a run starts when at least this share of those gaps went on long enough to hold it
LOG_REPEAT_S = 60.0


@dataclass(frozen=True)
class Answer:
    """What a comparison needs of one answer, as plain values."""

    decisions: tuple[Hashable, ...] = ()  # compared one by one: top-1 labels, pair decisions, the best caption
    vectors: np.ndarray | None = None  # (N, D) embeddings, compared row by row by cosine
    scores: tuple[float, ...] | None = None  # compared by Pearson correlation


@dataclass(frozen=True)
class Comparison:
    agree: int
    disagree: int
    cosine: float | None = None  # mean over the rows
    correlation: float | None = None  # None when undefined (fewer than 2 scores, or constant ones)


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean cosine of the rows of ``a`` and ``b`` (a zero row counts as 0)."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)
    dots = np.sum(a64 * b64, axis=-1)
    cosines = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return float(np.clip(cosines, -1.0, 1.0).mean())


def pearson(a: tuple[float, ...], b: tuple[float, ...]) -> float | None:
    """Pearson correlation of two score lists; None when it is undefined."""
    if len(a) != len(b) or len(a) < 2:
        return None
    x = np.asarray(a, dtype=np.float64) - np.mean(a)
    y = np.asarray(b, dtype=np.float64) - np.mean(b)
    denominator = float(np.sqrt(np.sum(x * x) * np.sum(y * y)))
    if denominator == 0.0:
        return None
    return float(np.clip(np.sum(x * y) / denominator, -1.0, 1.0))


def compare(primary: Answer, shadow: Answer) -> Comparison:
    """How far the shadow's answer agrees with the primary's, for the same request."""
    if len(primary.decisions) != len(shadow.decisions):
        raise ValueError(f"{len(primary.decisions)} decisions against {len(shadow.decisions)}")
    agree = sum(p == s for p, s in zip(primary.decisions, shadow.decisions, strict=True))
    cosine = None
    if primary.vectors is not None and shadow.vectors is not None:
        if primary.vectors.shape != shadow.vectors.shape:  # versions of different widths
            raise ValueError(f"embeddings {primary.vectors.shape} against {shadow.vectors.shape}")
        cosine = mean_cosine(primary.vectors, shadow.vectors)
    correlation = None
    if primary.scores is not None and shadow.scores is not None:
        correlation = pearson(primary.scores, shadow.scores)
    return Comparison(agree, len(primary.decisions) - agree, cosine, correlation)


@dataclass
class EndpointStats:
    """Running totals of one endpoint's shadow runs on one version."""

    compared: int = 0  # requests whose answers were compared
    dropped: int = 0
    failed: int = 0
    agree: int = 0
    disagree: int = 0
    cosine_sum: float = 0.0
    cosines: int = 0
    correlation_sum: float = 0.0
    correlations: int = 0

    def add(self, c: Comparison) -> None:
        self.compared += 1
        self.agree += c.agree
        self.disagree += c.disagree
        if c.cosine is not None:
            self.cosine_sum += c.cosine
            self.cosines += 1
        if c.correlation is not None:
            self.correlation_sum += c.correlation
            self.correlations += 1

    @property
    def agreement(self) -> float | None:
        """Share of the compared decisions on which the shadow agreed (None: none compared)."""
        decisions = self.agree + self.disagree
        return self.agree / decisions if decisions else None

    @property
    def mean_cosine(self) -> float | None:
        return self.cosine_sum / self.cosines if self.cosines else None

    @property
    def mean_correlation(self) -> float | None:
        return self.correlation_sum / self.correlations if self.correlations else None


class TrafficGaps:
    """The recent gaps between requests of the versions that answer callers (seconds from the end
    of one to the start of the next while nothing else was in flight), and whether a shadow run
    started in the current gap would likely end before the next request comes."""

    def __init__(self, capacity: int = GAP_HISTORY) -> None:
        self._gaps: deque[float] = deque(maxlen=capacity)

    def add(self, seconds: float) -> None:
        self._gaps.append(seconds)

    def fits(self, idle_s: float, run_s: float) -> bool:
        """Whether, of the remembered gaps that lasted ``idle_s``, at least ``FIT_SHARE`` lasted
        ``run_s`` longer (True too when fewer than ``GAP_EVIDENCE`` lasted that long)."""
        longer = [g for g in self._gaps if g > idle_s]
        if len(longer) < GAP_EVIDENCE:
            return True
        return sum(g >= idle_s + run_s for g in longer) >= FIT_SHARE * len(longer)


@dataclass
class _RunLength:
    """A moving average of how long shadow runs take (0 until the first one ended)."""

    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.seconds = seconds if self.seconds == 0.0 else 0.8 * self.seconds + 0.2 * seconds


@dataclass(eq=False)
class ShadowJob(Generic[A]):
    """One sampled request: its answer as sent, and how to compute it again on another version."""

    version: str  # the shadow version it was sampled for
    endpoint: str  # the route template, e.g. "/classify"
    primary: A
    rerun: Callable[[ModelRuntime], Awaitable[A]]
    summarize: Callable[[A], Answer]


@dataclass
class _Failures:
    logged_at: float = 0.0
    last: str | None = None


class ShadowRunner:
    """The bounded queue and single worker of one served alias' shadow runs.

    ``lease(version)`` is the loaded shadow runtime of that version (None once it is gone);
    ``busy()`` says whether the versions that answer callers have work queued; ``idle_since()``
    when their last request ended (monotonic), None while one is in flight (None: never waits).
    """

    def __init__(
        self,
        model: str,
        metrics: ServiceMetrics,
        lease: Callable[[str], ModelRuntime | None],
        busy: Callable[[], bool],
        capacity: int = SHADOW_QUEUE,
        idle_since: Callable[[], float | None] | None = None,
        quiet_s: float = SHADOW_QUIET_S,
        wait_s: float = SHADOW_WAIT_S,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self._lease = lease
        self._busy = busy
        self._idle_since = idle_since
        self._quiet_s = quiet_s
        self._wait_s = wait_s
        self._gaps = TrafficGaps()  # fed by the model's requests (``note_gap``)
        self._run_length = _RunLength()
        self._queue: asyncio.Queue[ShadowJob[Any]] = asyncio.Queue(maxsize=capacity)
        self._task: asyncio.Task[None] | None = None
        self._stats: dict[str, dict[str, EndpointStats]] = {}  # version -> endpoint -> totals
        self._failures = _Failures()

    async def start(self) -> None:
        self.launch()

    def launch(self) -> None:
        """Start the worker unless it runs (from the event loop; returns at once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work(), name=f"shadow-runner {self.model}")

    def stop(self) -> asyncio.Task[None] | None:
        """Cancel the worker and drop the queued jobs now; returns the worker's task to await (the
        next ``launch`` starts a new one)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        while not self._queue.empty():  # jobs hold request bodies: let them go
            self._queue.get_nowait()
        return task

    async def close(self) -> None:
        task = self.stop()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def offer(self, job: ShadowJob[Any]) -> None:
        """Queue a sampled request whose answer was sent, or drop it when the queue is full (a
        coroutine: Starlette would run a plain function of a background task in a thread)."""
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._drop(job, "queue_full")

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def summary(self, version: str) -> dict[str, EndpointStats]:
        """Totals per endpoint of the shadow runs on ``version`` (a copy)."""
        # list(): GET /models reads this from a worker thread while the event loop may add to it.
        totals = list(self._stats.get(version, {}).items())
        return {endpoint: EndpointStats(**vars(stats)) for endpoint, stats in totals}

    def forget(self, version: str) -> None:
        """Drop the totals of a version that is no longer loaded."""
        self._stats.pop(version, None)

    def _totals(self, job: ShadowJob[Any]) -> EndpointStats:
        return self._stats.setdefault(job.version, {}).setdefault(job.endpoint, EndpointStats())

    def _drop(self, job: ShadowJob[Any], reason: str) -> None:
        self._totals(job).dropped += 1
        self.metrics.shadow_request(self.model, job.version, job.endpoint, reason)

    def note_gap(self, seconds: float) -> None:
        """A request of the versions that answer callers started ``seconds`` after the last one
        ended, nothing being in flight meanwhile."""
        self._gaps.add(seconds)

    async def until_quiet(self) -> bool:
        """Wait until the versions that answer callers have been idle for ``quiet_s`` and the
        traffic's recent gaps say a run would likely end before the next request (True), or give
        up after ``wait_s`` (False)."""
        if self._idle_since is None or self._quiet_s <= 0:  # 0: no waiting at all
            return True
        deadline = time.monotonic() + self._wait_s
        while True:
            since, now = self._idle_since(), time.monotonic()
            pause = self._quiet_s if since is None else self._quiet_s - (now - since)
            if pause <= 0:
                assert since is not None
                if self._gaps.fits(now - since, self._run_length.seconds):
                    return True
                pause = self._quiet_s / 4  # look again a little later in this gap
            if now + pause > deadline:
                return False
            await asyncio.sleep(pause)

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                if await self.until_quiet():
                    await self.run(job)
                else:
                    self._drop(job, "busy")
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one comparison must not stop the shadow
                log.exception("shadow run of %s on %s of %s failed", job.endpoint, job.version, self.model)
            finally:
                del job  # the request body it holds is not kept while the queue is empty

    async def run(self, job: ShadowJob[Any]) -> None:
        """Re-run one sampled request on the shadow and record how its answer compares."""
        if self._busy():
            self._drop(job, "busy")
            return
        runtime = self._lease(job.version)
        if runtime is None:  # the shadow was replaced or removed since the request was sampled
            self._drop(job, "gone")
            return
        # Its own encode budget (request_timeout_s), apart from any request's.
        token = REQUEST_STAGES.set(RequestStages())
        try:
            started = time.monotonic()
            with runtime.held():
                answer = await job.rerun(runtime)
            self._run_length.add(time.monotonic() - started)
            comparison = compare(job.summarize(job.primary), job.summarize(answer))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # refused (a full queue, an encoder the shadow lacks) or a bug
            self._totals(job).failed += 1
            self.metrics.shadow_request(self.model, job.version, job.endpoint, "failed")
            self._log_failure(job, f"{type(exc).__name__}: {exc}")
            return
        finally:
            REQUEST_STAGES.reset(token)
        self._totals(job).add(comparison)
        self.metrics.shadow_compared(
            self.model,
            job.version,
            job.endpoint,
            agree=comparison.agree,
            disagree=comparison.disagree,
            cosine=comparison.cosine,
            correlation=comparison.correlation,
        )

    def _log_failure(self, job: ShadowJob[Any], error: str) -> None:
        # A new error is logged at once; the same one again once a minute at most.
        now = time.monotonic()
        if error != self._failures.last or now - self._failures.logged_at >= LOG_REPEAT_S:
            log.warning("shadow run of %s on %s of %s failed: %s", job.endpoint, job.version, self.model, error)
            self._failures = _Failures(logged_at=now, last=error)
