"""Pixels by shared memory: a front-end's ring of model-input pixels, and the engine's read of it.

Inline in the relayed body, 224 px pixels (147 KiB an image) cost the engine about 160 us per
image: uvicorn reads a body past its 64 KiB high-water mark in several pauses of the socket
(docs/benchmarks.md, "The engine's share"). A front-end therefore writes a request's pixels, when
they are at least ``MIN_SHARED_BYTES``, into its own POSIX shared memory segment (``PixelRing``:
created and its pages reserved at start, unlinked at exit, and by multiprocessing's resource
tracker should the front-end die) and names the segment and the offset in the body's manifest
(service.split.wire); the region is the request's until its answer comes back
(``PixelLease.release``). The engine maps each front-end's segment once, read-only
(``SharedPixels``), and copies a request's pixels out as it unpacks them, so nothing it keeps (a
shadow's run after the answer included) points into a region a front-end may reuse. A full
ring, or no /dev/shm (or not ``RING_BYTES`` of it), sends the pixels inline as before. At 64 px
(12 KiB an image) the inline copy costs nothing measurable: those stay inline.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from multiprocessing import shared_memory
from pathlib import Path

# Requests whose pixels are fewer bytes than this send them inline (12 KiB per 64 px image, 147
# KiB per 224 px one: the line sits between one 96 px image and one 112 px one).
MIN_SHARED_BYTES = 32 * 1024
# Per front-end, reserved in /dev/shm at start: 111 images of 224 px in flight, 49 of 336 px.
RING_BYTES = 16 * 1024 * 1024
NAME_PREFIX = "clip-pixels-"
_NAME = re.compile(rf"{NAME_PREFIX}[0-9]+-[0-9a-f]+")
SHM_DIR = Path("/dev/shm")  # where POSIX shared memory lives on Linux


class PixelLease:
    """``size`` bytes of a ring at ``offset``, the request's until ``release``."""

    def __init__(self, ring: PixelRing, offset: int, size: int) -> None:
        self.ring, self.offset, self.size = ring, offset, size
        buffer = ring.memory.buf
        assert buffer is not None  # None only once closed
        self.view = buffer[offset : offset + size]

    @property
    def name(self) -> str:
        return self.ring.name

    def release(self) -> None:
        self.view.release()
        self.ring.free(self.offset)


class PixelRing:
    """A front-end's shared memory segment, handed out in leases (first fit; any thread)."""

    def __init__(self, size: int = RING_BYTES) -> None:
        name = f"{NAME_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        self.memory = shared_memory.SharedMemory(name=name, create=True, size=size)
        self.name, self.size = name, size
        try:
            _reserve(SHM_DIR / name, size)
        except OSError:
            self.close()
            raise
        self._taken: dict[int, int] = {}  # offset -> size
        self._lock = threading.Lock()

    @classmethod
    def open(cls) -> PixelRing | None:
        """A new ring, or None where POSIX shared memory cannot be had, or not ``RING_BYTES`` of it
        (pixels then go inline)."""
        try:
            return cls()
        except OSError:
            return None

    def lease(self, size: int) -> PixelLease | None:
        """``size`` bytes, or None when no gap is that large (the request's pixels go inline)."""
        with self._lock:
            at = 0
            for offset in sorted(self._taken):
                if offset - at >= size:
                    break
                at = offset + self._taken[offset]
            if at + size > self.size:
                return None
            self._taken[at] = size
        return PixelLease(self, at, size)

    def free(self, offset: int) -> None:
        with self._lock:
            del self._taken[offset]

    @property
    def leased_bytes(self) -> int:
        with self._lock:
            return sum(self._taken.values())

    def close(self) -> None:
        self.memory.unlink()
        try:
            self.memory.close()
        except BufferError:  # a lease still out (a relay cancelled by the shutdown): the exit unmaps it
            pass


def _reserve(path: Path, size: int) -> None:
    """Takes the segment's pages in /dev/shm now: a segment is sparse, and a write to a page a full
    /dev/shm cannot give is a SIGBUS, not an error (a small /dev/shm, as containers have, fails here)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


class SharedPixels:
    """The engine's read-only maps of the front-ends' rings, opened on first use, by name."""

    def __init__(self, directory: Path = SHM_DIR) -> None:
        self.directory = directory
        self._maps: dict[str, mmap.mmap] = {}

    def read(self, name: str, offset: int, size: int) -> bytes:
        """A copy of ``size`` bytes at ``offset`` of ring ``name``; ValueError for what no front-end
        names (another file, a range past the segment)."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a pixel ring: {name!r}")
        mapped = self._maps.get(name)
        if mapped is None:
            fd = os.open(self.directory / name, os.O_RDONLY)
            try:
                mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)
            self._maps[name] = mapped
        if offset < 0 or size < 0 or offset + size > len(mapped):
            raise ValueError(f"pixels past the end of ring {name}")
        return mapped[offset : offset + size]
