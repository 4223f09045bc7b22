"""``python -m service`` with ``workers`` > 1: one engine process and N front-end processes.

The supervisor starts the engine (the application on a unix socket in a private temporary
folder), waits for its socket, then starts the front-ends, each listening on the public
host:port with SO_REUSEPORT (the kernel spreads connections over them). Every child gets the same
flags and environment, hence the same settings. SIGTERM (or SIGINT) drains: the front-ends stop
accepting and finish their requests first (the engine still answers them), then the engine
drains; the supervisor exits 0 when all exited cleanly. A child that dies on its own ends the whole
service with a non-zero exit, so the orchestrator restarts it whole: never half alive.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from service.config import Settings

log = logging.getLogger("service")

# Below this many cores a CPU-only node serves from one process: the second process and the extra
# hop cost CPU the model needs (docs/benchmarks.md, "Front-ends and an engine").
AUTO_MIN_CPU_CORES = 8
MAX_AUTO_WORKERS = 8
_PR_SET_PDEATHSIG = 1
ENGINE_START_S = 600.0  # importing torch and binding the socket: long on a cold, slow disk


def cores() -> int:
    """Cores this process may run on (its CPU affinity, which container CPU sets restrict)."""
    return len(os.sched_getaffinity(0))


def workers_for(settings: Settings, available: int | None = None) -> int:
    """The number of front-ends ``settings.workers`` asks for on this machine."""
    if settings.workers != "auto":
        return settings.workers
    available = cores() if available is None else available
    if _uses_cuda(settings.device):
        return max(1, min(available - 2, MAX_AUTO_WORKERS))
    if available < AUTO_MIN_CPU_CORES:
        return 1
    return min(available // 4, MAX_AUTO_WORKERS)


def engine_threads(settings: Settings, workers: int, available: int | None = None) -> int | None:
    """The engine's intra-op threads on the CPU (the cores the front-ends leave), or None to keep
    the setting: an explicit ``torch_threads``, or a CUDA device (the GPU does the arithmetic)."""
    if settings.torch_threads or _uses_cuda(settings.device):
        return None
    available = cores() if available is None else available
    return max(1, available - workers)


def _uses_cuda(device: str) -> bool:
    if device == "auto":
        import torch  # the supervisor imports torch only to resolve `auto`

        return bool(torch.cuda.is_available())
    return device.startswith("cuda")


def child_settings(argv: Sequence[str]) -> Settings:
    """The settings of a child process: the supervisor's own flags and environment, read again."""
    from service.cli import parse_args
    from service.logs import install_logging

    settings = Settings(**parse_args(list(argv)))
    install_logging(settings.log_level)
    return settings


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes of this user may bind too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


def _die_with_parent() -> None:
    # A child outlives a supervisor killed with SIGKILL otherwise (Linux: the kernel signals it).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def run(settings: Settings, argv: Sequence[str], workers: int) -> int:
    """Run the engine and ``workers`` front-ends until SIGTERM or a child's death; the exit code."""
    folder = Path(tempfile.mkdtemp(prefix="clip-engine-"))  # 0700: only this user reaches the engine
    engine_socket, metrics_dir = folder / "engine.sock", folder / "metrics"
    metrics_dir.mkdir()
    env = dict(os.environ)
    threads = engine_threads(settings, workers)
    engine_env = {**env, "CLIP_TORCH_THREADS": str(threads)} if threads is not None else env
    frontend_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    # Held, bound but not listening, for as long as the service runs: port 0 becomes one port that
    # every front-end binds, and no other program takes the port meanwhile.
    reserved = reuse_port_socket(settings.host, settings.port)
    port = reserved.getsockname()[1]
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        log.info("starting the engine and %d front-ends on %s:%d (torch threads of the engine: %s)",
                 workers, settings.host, port, threads if threads is not None else settings.torch_threads)  # fmt: skip
        engine = _start("engine", ["service.split.engine", str(engine_socket), *argv], engine_env)
        children.append(("engine", engine))
        _wait_for_socket(engine, engine_socket)
        for i in range(workers):
            command = ["service.split.frontend", str(engine_socket), str(port), *argv]
            children.append((f"front-end {i}", _start(f"front-end {i}", command, frontend_env)))
        code = _watch(children)
    except _Stop:
        log.info("draining: front-ends first, then the engine")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the drain itself is not interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        drained = _drain(children, settings.graceful_shutdown_s)
        for s, handler in previous.items():
            signal.signal(s, handler)
        reserved.close()
        shutil.rmtree(folder, ignore_errors=True)
    return code if code else (0 if drained else 1)


def _start(name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A group of its own: a Ctrl-C in a terminal reaches the supervisor only, which drains in order.
    process = subprocess.Popen(
        # -P as the supervisor was started: the same code serves (PYTHONPATH, not the working directory).
        [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m", *command],
        env=env,
        process_group=0,
        preexec_fn=_die_with_parent,
    )
    log.info("%s started (pid %d)", name, process.pid)
    return process


def _wait_for_socket(engine: subprocess.Popen[bytes], path: Path) -> None:
    deadline = time.monotonic() + ENGINE_START_S
    while not path.exists():
        if engine.poll() is not None:
            raise SystemExit(f"the engine process exited with code {engine.returncode} before it listened")
        if time.monotonic() > deadline:
            raise SystemExit(f"the engine process did not listen within {ENGINE_START_S:g}s")
        time.sleep(0.05)


def _watch(children: list[tuple[str, subprocess.Popen[bytes]]]) -> int:
    """Block until a child exits (an error: children run until told to stop); its exit code or 1."""
    while True:
        for name, process in children:
            code = process.poll()
            if code is not None:
                log.error("%s (pid %d) exited with code %d: stopping the service", name, process.pid, code)
                return code or 1
        time.sleep(0.2)


def _drain(children: list[tuple[str, subprocess.Popen[bytes]]], grace_s: float) -> bool:
    """SIGTERM the front-ends, wait, then the engine; True when every child exited with 0."""
    frontends = [(n, p) for n, p in children if n != "engine"]
    engines = [(n, p) for n, p in children if n == "engine"]
    clean = True
    for group in (frontends, engines):
        for _, process in group:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in group:
            try:
                code = process.wait(timeout=grace_s + 10)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) did not stop within %gs: killed", name, process.pid, grace_s + 10)
                process.kill()
                code = process.wait()
            clean = clean and code == 0
    return clean
