"""Redis Sentinel and Redis Cluster as real processes on 127.0.0.1, for the cache's HA tests.

Every process listens on a free port, works in its own temporary directory, persists no data (the
cache needs none) and is killed when its setup closes, whatever happened before; every wait is
bounded. ``redis-server`` runs the data nodes and ``redis-sentinel`` the Sentinels (Debian
packages redis-server and redis-sentinel; scripts/test.sh installs both).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from loadtests.local_stack import free_port, redis_server_command

MASTER_NAME = "clipcache"


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> float:
    """Poll ``check`` (exceptions count as False) until it holds; the seconds it took, or
    TimeoutError naming ``what``."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


def missing_binaries(*names: str) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


class RedisNode:
    """One redis-server (plain, replica or cluster node) that may be killed and started again on
    the same port, in the same directory (so a cluster node finds its nodes.conf again)."""

    def __init__(self, workdir: Path, args: Sequence[str] = (), password: str | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.args = list(args)
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> RedisNode:
        cmd = [*redis_server_command(self.port, self.workdir), *self.args]
        if self.password:
            cmd += ["--requirepass", self.password, "--masterauth", self.password]
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            wait_until(lambda: bool(self.client().ping()), 10, f"redis-server on port {self.port}")
        return self

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients, replicas or the cluster."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=2, **kwargs)

    def dbsize(self) -> int:
        with self.client() as c:
            return int(c.dbsize())

    def exists(self, *keys: str) -> int:
        with self.client() as c:
            return int(c.exists(*keys))


class SentinelSetup:
    """A master, one replica and three Sentinels (quorum 2) that fail over quickly.

    ``start`` returns as soon as the processes answer; ``wait_ready`` waits until a failover
    could happen (the replica in sync, each Sentinel knowing the replica and the two other
    Sentinels, which takes about two seconds of Sentinel hello messages), so a caller can do
    other work meanwhile.
    """

    def __init__(
        self,
        root: Path,
        *,
        down_after_ms: int = 1000,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.root = root
        self.down_after_ms = down_after_ms
        self.password = password
        self.sentinel_password = sentinel_password
        self.master = RedisNode(root / "master", password=password)
        self.replica = RedisNode(
            root / "replica", ["--replicaof", "127.0.0.1", str(self.master.port)], password=password
        )
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{hosts}/{MASTER_NAME}/0{query}"

    def start(self) -> SentinelSetup:
        try:
            self.master.start()
            self.replica.start()
            for port in self.sentinel_ports:
                self._start_sentinel(port)
            for port in self.sentinel_ports:
                wait_until(lambda p=port: self._master_known(p), 10, f"sentinel on port {port}")
        except BaseException:
            self.close()
            raise
        return self

    def _start_sentinel(self, port: int) -> None:
        workdir = self.root / f"sentinel-{port}"
        workdir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {workdir}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2",
            # Short, so a test sees a failover within seconds (production configurations keep
            # several seconds: a loaded machine would otherwise fail over for nothing).
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} 2000",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {MASTER_NAME} {self.password}")
        if self.sentinel_password:
            lines += [f"requirepass {self.sentinel_password}", f"sentinel sentinel-pass {self.sentinel_password}"]
        conf = workdir / "sentinel.conf"  # Sentinel rewrites its configuration: a file of its own
        conf.write_text("\n".join(lines) + "\n")
        with open(workdir / "sentinel.log", "ab") as log:
            self._sentinels.append(
                subprocess.Popen(["redis-sentinel", str(conf)], stdout=log, stderr=subprocess.STDOUT)
            )

    def sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.sentinel_password, socket_timeout=2)

    def _master_known(self, port: int) -> bool:
        with self.sentinel_client(port) as c:
            return c.sentinel_get_master_addr_by_name(MASTER_NAME) is not None

    def wait_ready(self, timeout: float = 20) -> None:
        def ready() -> bool:
            with self.replica.client() as c:
                if c.info("replication").get("master_link_status") != "up":
                    return False
            for port in self.sentinel_ports:
                with self.sentinel_client(port) as c:
                    state = c.sentinel_master(MASTER_NAME)
                    if state["num-slaves"] < 1 or state["num-other-sentinels"] < 2:
                        return False
            return True

        wait_until(ready, timeout, "sentinels that know each other and the replica", interval=0.05)

    def master_ports(self) -> set[int]:
        """The master port each answering Sentinel reports."""
        ports = set()
        for port in self.sentinel_ports:
            try:
                with self.sentinel_client(port) as c:
                    address = c.sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                continue
            if address:
                ports.add(int(address[1]))
        return ports

    def roles(self) -> tuple[RedisNode, RedisNode]:
        """(master, replica) as the Sentinels see them now: on a loaded machine they may have
        failed over once already, for nothing."""
        (port,) = self.master_ports()
        return (self.master, self.replica) if port == self.master.port else (self.replica, self.master)

    def wait_for_master(self, node: RedisNode, timeout: float = 20) -> float:
        """Seconds until every Sentinel names ``node`` the master and it acts as one."""

        def promoted() -> bool:
            if self.master_ports() != {node.port}:
                return False
            with node.client() as c:
                return c.info("replication")["role"] == "master"

        return wait_until(promoted, timeout, f"a failover to port {node.port}")

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for proc in self._sentinels:
            proc.kill()
            proc.wait(timeout=10)
        self._sentinels.clear()
        self.replica.kill()
        self.master.kill()


class ClusterSetup:
    """A Redis Cluster of three masters (no replicas), built with ``redis-cli --cluster create``.

    ``cluster-require-full-coverage no``: while a master is down the others keep serving their
    slots. A node restarted by ``restart`` comes back with its nodes.conf, so with the same id
    and slots, and empty (nothing is persisted).
    """

    def __init__(self, root: Path, masters: int = 3, node_timeout_ms: int = 1000) -> None:
        self.nodes = []
        for i in range(masters):
            bus = free_port()  # the default (port + 10000) may be taken or beyond 65535
            args = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(bus),
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout_ms),
                "--cluster-require-full-coverage",
                "no",
            ]
            self.nodes.append(RedisNode(root / f"node-{i}", args))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> ClusterSetup:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=30,
            )
            for node in self.nodes:
                self.wait_ok(node)
        except BaseException:
            self.close()
            raise
        return self

    def wait_ok(self, node: RedisNode, timeout: float = 20) -> float:
        def ok() -> bool:
            with node.client() as c:
                info = c.cluster("info")
                return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(self.nodes))

        return wait_until(ok, timeout, f"cluster state ok on port {node.port}", interval=0.05)

    def restart(self, node: RedisNode) -> float:
        """Start a killed node again; seconds until it serves its slots."""
        node.start()
        return self.wait_ok(node)

    def node_for(self, key: str) -> RedisNode:
        with self.nodes[0].client() as c:
            slot = int(c.cluster("keyslot", key))
            for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return next(n for n in self.nodes if n.port == int(primary[1]))
        raise LookupError(f"no node serves slot {slot}")

    def __enter__(self) -> ClusterSetup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
