"""Progress of a training loop: a bar on a terminal, one line at a time in a log.

Redirected to a file or read by a log collector (a Kubernetes Job's logs), a rich progress bar
prints once, when it ends: minutes of silence, then a finished bar. ``StepProgress`` draws the bar
only when standard output is a terminal; otherwise it prints one line every ``every_seconds``
(and at the end): ``label 120/2200 loss 4.211 elapsed 63s``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# Seconds between two progress lines when the output is not a terminal.
LINE_EVERY_SECONDS = 10.0


def chance_loss(batch_size: int) -> float:
    """A contrastive (InfoNCE) loss at chance over ``batch_size`` candidates: ln(batch size)."""
    return math.log(max(1, batch_size))


def loss_with_chance(loss: float, batch_size: int) -> str:
    """``0.912 (chance: ln 128 = 4.852)``: a loss with the figure that means nothing was learned."""
    return f"{loss:.3f} (chance: ln {batch_size} = {chance_loss(batch_size):.3f})"


class StepProgress:
    """``with StepProgress("base", total=2200) as bar: bar.update(info="loss 4.2")`` per step."""

    def __init__(
        self,
        label: str,
        total: int,
        completed: int = 0,
        *,
        enabled: bool = True,
        every_seconds: float = LINE_EVERY_SECONDS,
        terminal: bool | None = None,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self.label, self.total, self.completed, self.info = label, total, completed, ""
        self.enabled, self.every_seconds = enabled, every_seconds
        self.terminal = Console().is_terminal if terminal is None else terminal
        self.write = write or (lambda line: print(line, file=sys.stdout, flush=True))
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._start = self._last = 0.0

    def __enter__(self) -> StepProgress:
        self._start = self._last = time.monotonic()
        if self.enabled and self.terminal:
            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.completed, info="")
        return self

    def update(self, advance: int = 1, info: str | None = None) -> None:
        self.completed += advance
        if info is not None:
            self.info = info
        if not self.enabled:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=advance, info=self.info)
            return
        now = time.monotonic()
        if now - self._last >= self.every_seconds or self.completed >= self.total:
            self._last = now
            self.write(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self._start
        info = f" {self.info}" if self.info else ""
        return f"{self.label} {self.completed}/{self.total}{info} elapsed {elapsed:.0f}s"

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
