"""One loaded model version as the service runs it: its batchers, its model thread, its role.

A ``ModelRuntime`` is one loaded version with its own batchers (one for images, one per
text-encoder variant, and for a version with a DCSM scorer one each for dense image and dense
text features) sharing a single worker thread, so model calls of one version never overlap.
``service.runtime.assembly`` builds one; ``service.runtime.roles`` says what it does for its alias.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from clipcore.backends.base import AutoDecision
from clipcore.errors import ClipError, ErrorCode
from clipcore.models.bundle import ModelBundle
from service.runtime.batcher import DynamicBatcher
from service.runtime.measured import MeasuredComparatives
from service.runtime.roles import PRIMARY
from service.split.wire import bundle_spec

__all__ = ["ModelRuntime"]

T = TypeVar("T")


@dataclass(eq=False)
class ModelRuntime:
    bundle: ModelBundle
    image_batcher: DynamicBatcher[np.ndarray, np.ndarray]
    text_batchers: dict[str, DynamicBatcher[str, np.ndarray]]
    executor: concurrent.futures.ThreadPoolExecutor
    # Only for versions with a DCSM component; None otherwise.
    dense_image_batcher: DynamicBatcher[np.ndarray, np.ndarray] | None = None
    # Whether the dense image batcher's rows start with the pooled embedding (2+P rows an image:
    # one tower pass gives both); else its rows are the class and patch tokens alone.
    dense_gives_pooled: bool = False
    # Only for versions with a YUKINO component: images -> (2, D) yes / no prompt features.
    yukino_batcher: DynamicBatcher[np.ndarray, np.ndarray] | None = None
    dense_text_batcher: DynamicBatcher[str, np.ndarray] | None = None
    active: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    backend: str = "torch fp32"  # what the pooled batchers call, for logs
    auto: AutoDecision | None = None  # how precision=auto / backend=auto picked it (GET /models shows it)
    load_s: float = 0.0  # seconds from reading the store to serving, for Retry-After while one loads
    role: str = PRIMARY
    entry: str = ""  # the served-set entry it serves (``default@production``): its metrics' `model` label
    # Resident bytes of its weights (tensors of the serving towers), for the memory budget.
    weight_bytes: int = 0
    # What the version's eval.json measured of its comparatives library, read at load (for /classify).
    measured_comparatives: list[MeasuredComparatives] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return self.bundle.ref

    @functools.cached_property
    def logit_scale(self) -> float:
        """The bundle's logit scale, read once: a served version's weights do not change, and
        reading it is a torch op (tens of microseconds) that /classify paid on every request."""
        return self.bundle.logit_scale

    @functools.cached_property
    def pixel_spec(self) -> str:
        """What this version's model-input pixels depend on (``service.split.wire.bundle_spec``), read
        once: every pre-decoded request compares its pixels' spec with it, and making it builds the
        version's preprocessing config from its manifest."""
        return bundle_spec(self.bundle)

    @property
    def version(self) -> str:
        return self.bundle.version

    def set_role(self, role: str) -> None:
        """Take ``role``; a canary's or shadow's batchers are named ``canary:image``,
        ``shadow:text-base`` ..., so their queues and batch times are told apart from the primary's
        (whose plain names dashboards and autoscaling read), and lose the prefix when promoted."""
        self.role = role
        for batcher in self.batchers:
            base = batcher.name.rpartition(":")[2]
            batcher.name = base if role == PRIMARY else f"{role}:{base}"

    @contextlib.contextmanager
    def held(self) -> Iterator[ModelRuntime]:
        """Count one user (a request, a shadow run) until the block ends: a retired version is
        stopped only once it is idle."""
        self.active += 1
        self.idle.clear()
        try:
            yield self
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    @property
    def batchers(self) -> list[DynamicBatcher]:  # type: ignore[type-arg]
        extra = (self.dense_image_batcher, self.dense_text_batcher, self.yukino_batcher)
        dense = [b for b in extra if b is not None]
        return [self.image_batcher, *self.text_batchers.values(), *dense]

    async def start(self) -> None:
        self.idle.set()
        for batcher in self.batchers:
            await batcher.start()

    async def stop(self) -> None:
        for batcher in self.batchers:
            await batcher.stop(drain=True)
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run model work (not batched, e.g. DCSM scoring) on this version's model thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        except RuntimeError as exc:
            if "shutdown" not in str(exc):
                raise
            # Only after a drain timeout: the version was stopped under a slow request.
            raise ClipError(ErrorCode.not_ready, "model is being replaced; retry", retry_after=1) from None
