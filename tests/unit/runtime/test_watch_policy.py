"""Which failed loads the model watcher retries (with backoff) and which it refuses for good."""

from __future__ import annotations

import pytest

from clipcore.backends.base import BackendError
from model_store import ChecksumMismatch, InvalidManifest, ModelNotFound
from service.runtime.policy import MAX_BACKOFF_S, backoff_s, may_pass


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (OSError(5, "Input/output error"), True),
        (PermissionError(13, "Permission denied"), True),
        (MemoryError(), True),
        (ModelNotFound("version m@v2 not found"), True),
        (ChecksumMismatch("m", "v2", {"model.safetensors": "unreadable: Is a directory"}), True),
        (ChecksumMismatch("m", "v2", {"model.safetensors": "missing"}), True),
        (ChecksumMismatch("m", "v2", {"model.safetensors": "sha256 mismatch", "x": "missing"}), False),
        (InvalidManifest("bad manifest"), False),
        (BackendError("min probe cosine 0.98 < 0.999"), False),
        (ValueError("warm-up produced non-finite embeddings"), False),
    ],
)
def test_only_failures_that_may_pass_are_retried(exc: BaseException, retried: bool) -> None:
    assert may_pass(exc) is retried


def test_backoff_doubles_from_the_interval_to_a_cap() -> None:
    assert [backoff_s(2.0, n) for n in range(5)] == [2.0, 2.0, 4.0, 8.0, 16.0]
    assert backoff_s(2.0, 50) == MAX_BACKOFF_S
    assert backoff_s(600.0, 3) == 600.0  # never shorter than the interval itself
