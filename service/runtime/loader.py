"""One way a version is loaded, for every caller: a first load, a hot swap, a canary or shadow
loaded beside the primary, and re-timing's second copy of the serving version.

Each load reads the version from the store (checksums verified), warms it up, picks its serving
towers behind the parity gate (``assembly.serving_towers``) in a worker thread, then builds and
starts its runtime on the event loop. ``prepare`` and ``start`` are the two halves; re-timing runs
``prepare`` with its interruption and pacing and starts only a winner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from clipcore.backends.auto import Interrupted, Pace
from clipcore.backends.base import ServingTowers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from service.config import Settings
from service.runtime.assembly import build_runtime, serving_towers, warm_up, weight_bytes
from service.runtime.heap import settle
from service.runtime.measured import MeasuredComparatives, read_comparative_effects
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime

__all__ = ["Prepared", "VersionLoader"]

log = logging.getLogger("service.lifecycle")


@dataclass
class Prepared:
    """A version read, warmed up and gated, not serving yet."""

    bundle: ModelBundle
    towers: ServingTowers
    backend: str
    weight_bytes: int
    started: float  # perf_counter at the start of the read
    # What the version's eval.json measured of its comparatives library (for /classify).
    measured_comparatives: list[MeasuredComparatives]


class VersionLoader:
    """Loads versions of one served entry (``model``: the entry its metrics are labelled with) and
    counts the loads in progress (``loading``: a memory budget and re-timing wait for them;
    ``retiming``: second copies re-timing holds)."""

    def __init__(self, settings: Settings, store: ModelStore, metrics: ServiceMetrics, device: str, model: str) -> None:
        self.settings, self.store, self.metrics, self.device, self.model = settings, store, metrics, device, model
        self.loading = 0
        self.retiming = 0
        self.load_started: float | None = None  # monotonic start of the load in progress
        self.last_load_s: float | None = None  # how long the last load took

    async def load(self, name: str, version: str) -> ModelRuntime:
        """``name@version`` loaded, gated and started: it may serve."""
        self.loading += 1
        self.load_started = time.monotonic()
        try:
            prepared = await self.prepare(f"{name}@{version}")
            runtime = await self.start(prepared)
        finally:
            self.loading -= 1
            self.load_started = None
        self.last_load_s = runtime.load_s
        log.info("loaded %s on %s in %.2fs (backend %s; text encoders: %s; dcsm: %s)", runtime.ref, self.device,
                 runtime.load_s, runtime.backend, ", ".join(sorted(prepared.bundle.text_models)),
                 "yes" if prepared.bundle.dcsm is not None else "no")  # fmt: skip
        return runtime

    async def prepare(self, ref: str, interrupted: Interrupted | None = None, pace: Pace | None = None) -> Prepared:
        """Read, warm up and gate ``ref`` in a worker thread. ``interrupted`` / ``pace``: ``auto``'s
        timing stops when it says so / is paced after the read and each build and timed call."""

        def read() -> Prepared:
            started = time.perf_counter()
            bundle = ModelBundle.load(self.store, ref, self.device)  # verifies checksums
            if self.settings.warmup:
                warm_up(bundle)
            if pace is not None:
                pace(time.perf_counter() - started)
            size = weight_bytes(bundle)
            # Not skipped with warmup=False: the parity gate decides whether the version may serve.
            towers, backend = serving_towers(bundle, self.settings, self.device, self.store, interrupted=interrupted,
                                             pace=pace)  # fmt: skip
            measured = read_comparative_effects(self.store, bundle.manifest)
            return Prepared(bundle, towers, backend, size, started, measured)

        return await asyncio.to_thread(read)

    async def start(self, prepared: Prepared) -> ModelRuntime:
        """The runtime of a prepared version, its batchers started."""
        runtime = build_runtime(prepared.bundle, self.settings, self.metrics, prepared.towers, prepared.backend,
                                model=self.model)  # fmt: skip
        runtime.weight_bytes = prepared.weight_bytes
        runtime.measured_comparatives = prepared.measured_comparatives
        if runtime.auto is not None:
            decision = runtime.auto
            self.metrics.backend_auto(decision.outcome, decision.margin, decision.spread)
        await runtime.start()
        settle()  # the new version's objects join the frozen ones (only what is new is walked)
        runtime.load_s = time.perf_counter() - prepared.started
        return runtime
