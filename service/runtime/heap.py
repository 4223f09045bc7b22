"""Keeping Python's cyclic garbage collector off the objects that live as long as the process.

A served process holds millions of long-lived objects (torch, open_clip, FastAPI and the loaded
versions' modules). Under load, the objects requests leave behind (cache entries, reference
cycles of finished tasks) push the collector into full collections that walk all of them while
holding the GIL: 240-425 ms each on a 2-core EPYC with the tiny benchmark model, every few seconds,
and every request in flight waits that long (the p99 of /embed at 32 clients was 5-8x its p50).

``settle()`` collects once and moves every object alive then into the permanent generation
(``gc.freeze``), which later collections skip; it runs when the process has started and after each
version loads, where it costs little (only what was allocated since the last freeze is walked).
Reference counting still frees frozen objects; only cycles among them would wait. So when a version
is unloaded or retired, ``settle(full=True)`` first thaws everything, so that the version's cycles
are collected, then freezes what is left: one full collection per version that goes (about what
the collector did every few seconds under load before).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("service.runtime")

# Tracked allocations (net) between two young collections; CPython's default is 700. Each young
# collection walks the objects of every request in flight: under load the engine of a split service
# made about 20 a second, 0.3 ms of CPU each (0.04 ms per answer, 4 % of its CPU, on a 2-core EPYC
# with the tiny benchmark model). At 10,000 it makes one or two, of a few ms each: a pause well
# inside a request's own time, and a fifth or less of the CPU (docs/benchmarks.md, "Front-end cost").
YOUNG_THRESHOLD = 10_000


def collect_young_less_often() -> None:
    """Young collections every ``YOUNG_THRESHOLD`` allocations (the older generations' as they were)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def settle(*, full: bool = False) -> float:
    """Collect, then freeze what is alive (``full``: thaw every frozen object first, so cycles
    among them are collected too). Returns the seconds it took."""
    started = time.perf_counter()
    if full:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    seconds = time.perf_counter() - started
    log.debug("heap settled (%s) in %.1f ms; %d objects frozen", "full" if full else "new objects",
              seconds * 1000, gc.get_freeze_count())  # fmt: skip
    return seconds
