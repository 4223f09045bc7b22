"""The one resume path of every method: where a run's checkpoint goes, when it is written, how it
is read back, and what a run shares with its loop (seed, device, autocast, log).

A method's loop owns what its checkpoint holds (its weights, its optimiser, the step, its
history); this module only stores and finds it. A run that finds a checkpoint written under the
same ``settings`` resumes after its step; because every data source draws a step's batch from
(seed, step), the resumed run ends where an uninterrupted one does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.distributed import is_main

Log = Callable[[str], None]


@dataclass(frozen=True)
class Runtime:
    """Where and how a method's loop runs: its seed, device, autocast context and log."""

    seed: int = 0
    device: str = "cpu"
    amp: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    log: Log = field(default=print)


@dataclass(frozen=True)
class Checkpoints:
    """A run's checkpoint file (None: nothing saved, nothing resumed), written every ``every`` steps
    and at the run's last step; ``stop_after`` ends the run after that many steps in all.
    ``settings``: what a checkpoint must have been written under to be resumed (None: any)."""

    path: Path | None = None
    every: int = 100
    stop_after: int | None = None
    settings: Any = None

    def end(self, steps: int) -> int:
        """The step this run stops after (``steps``, or ``stop_after`` when that is sooner)."""
        return steps if self.stop_after is None else min(steps, self.stop_after)

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none or it was written under other settings
        (a run with another scorer shape, data or schedule must not start from it)."""
        if self.path is None or not self.path.exists():
            return None
        saved: dict[str, Any] = torch.load(self.path, map_location="cpu", weights_only=False)
        if self.settings is not None and saved.get("settings") != self.settings:
            return None
        return saved

    def due(self, done: int, end: int) -> bool:
        """Whether step ``done`` (1-based) of a run ending at ``end`` writes a checkpoint."""
        return self.path is not None and (done % self.every == 0 or done == end)

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` atomically (a crash mid-write leaves the previous checkpoint); under
        torchrun only rank 0 writes (the ranks hold the same weights)."""
        if self.path is None or not is_main():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        torch.save({**state, "settings": self.settings}, tmp)
        tmp.replace(self.path)


def resumed(label: str, start: int, log: Log) -> None:
    """Say where a run picked up (one wording for every method)."""
    if start:
        log(f"{label}: resumed from step {start}")
