"""Progress of a bulk run on stderr: a rich progress bar (rows, rate, ETA) on a terminal, a plain
line every few seconds otherwise (logs and pipes get no escape codes)."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

__all__ = ["Progress", "make_progress"]


class Progress(Protocol):
    def advance(self, rows: int) -> None: ...

    def close(self) -> None: ...


def _eta(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class PlainProgress:
    """``embed: 1200/20000 rows (6.0 %), 251.3 rows/s, ETA 0:01:14`` every ``interval`` seconds."""

    def __init__(self, name: str, total: int, done: int, stream: TextIO, interval: float) -> None:
        self.name, self.total, self.done, self.stream, self.interval = name, total, done, stream, interval
        self.started = time.monotonic()
        self.first = done  # rows before this run: not part of its rate
        self.last_line = self.started

    def _line(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (self.done - self.first) / elapsed
        share = 100.0 * self.done / self.total if self.total else 100.0
        eta = _eta((self.total - self.done) / rate) if rate > 0 else "?"
        print(
            f"{self.name}: {self.done}/{self.total} rows ({share:.1f} %), {rate:.1f} rows/s, ETA {eta}",
            file=self.stream,
            flush=True,
        )

    def advance(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.last_line >= self.interval:
            self.last_line = now
            self._line()

    def close(self) -> None:
        self._line()


class NoProgress:
    def advance(self, rows: int) -> None:
        pass

    def close(self) -> None:
        pass


class RichProgress:
    def __init__(self, name: str, total: int, done: int, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self.bar = Bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]} rows/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream),
        )
        self.started = time.monotonic()
        self.first = done
        self.task = self.bar.add_task(name, total=total, completed=done, rate="0.0")
        self.bar.start()

    def advance(self, rows: int) -> None:
        done = self.bar.tasks[0].completed + rows
        rate = (done - self.first) / max(time.monotonic() - self.started, 1e-9)
        self.bar.update(self.task, completed=done, rate=f"{rate:.1f}")

    def close(self) -> None:
        self.bar.stop()


def make_progress(
    name: str, total: int, done: int, mode: str = "auto", stream: Any = None, interval: float = 5.0
) -> Progress:
    """``mode``: ``bar`` (rich), ``plain`` (lines), ``none``, ``auto`` (a bar when ``stream`` is a terminal)."""
    stream = stream or sys.stderr
    if mode == "auto":
        mode = "bar" if stream.isatty() else "plain"
    if mode == "bar":
        return RichProgress(name, total, done, stream)
    if mode == "plain":
        return PlainProgress(name, total, done, stream, interval)
    if mode == "none":
        return NoProgress()
    raise ValueError(f"unknown progress mode {mode!r}: auto, bar, plain or none")
