"""``workers=2``: ``python -m service`` as a supervisor of one engine and two front-ends, checked
against the single process on the same store and inputs."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_ready

from loadtests.local_stack import free_port, metric_value, publish_tiny

pytestmark = pytest.mark.slow  # each test starts a supervisor, an engine and two front-ends

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Split:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def split_service(log: Path, **env: str) -> Iterator[Split]:
    port = free_port()
    environment = {**os.environ, "CLIP_WORKERS": "2", "CLIP_PORT": str(port), "CLIP_LOG_LEVEL": "warning", **env}
    environment.pop("CLIP_REDIS_URL", None)
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=environment, stdout=out, stderr=out)
    split = Split(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_ready(split.url, timeout=300)
        yield split
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, publish_dense_model: Any) -> Path:
    root = tmp_path_factory.mktemp("split-store")
    publish_tiny(root)
    publish_dense_model(root)
    return root


SERVED = "tiny@production,dense@production"


@pytest.fixture(scope="module")
def single(store: Path, serve_app: Any) -> Iterator[Any]:
    with serve_app(store=str(store), model=SERVED) as running:
        yield running


@pytest.fixture(scope="module")
def split(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    log = tmp_path_factory.mktemp("split-log") / "service.log"
    with split_service(log, CLIP_STORE=str(store), CLIP_MODEL=SERVED) as running:
        yield running


def close(a: Any, b: Any, path: str = "") -> None:
    """``a`` and ``b`` are the same JSON, numbers within float tolerance."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}.{i}")
    elif isinstance(a, float) and not isinstance(a, bool):
        assert b == pytest.approx(a, abs=1e-5), path
    else:
        assert a == b, path


def bodies(make_image: Any) -> list[tuple[str, dict[str, Any]]]:
    red, blue = make_image("circle", "red"), make_image("square", "blue", "large", x=0.3)
    return [
        ("/embed", {"images": [red, blue, red]}),
        ("/embed", {"texts": ["a red circle", "a blue square"]}),
        ("/classify", {"images": [red, blue], "labels": ["red circle", "blue square", "green cross"]}),
        ("/rank-pair", {"image_a": red, "image_b": blue, "difference": "the circle became a square"}),
        ("/rank-pair", {"pairs": [{"image_a": blue, "image_b": red, "difference": "it is red now"}]}),
        ("/score/dense", {"image": red, "texts": ["a red circle", "a blue square"], "model": "dense@production"}),
    ]


def test_every_endpoint_answers_as_one_process(single: Any, split: Split, make_image: Any) -> None:
    used = metric_value(split.url, "clip_predecoded_images_total", outcome="used")
    sent = metric_value(split.url, "clip_frontend_predecoded_images_total")
    for path, body in bodies(make_image):
        one, two = (
            httpx.post(single.url + path, json=body, timeout=60),
            httpx.post(split.url + path, json=body, timeout=60),
        )
        assert (one.status_code, two.status_code) == (200, 200), (path, two.text)
        close(one.json(), two.json(), path)
        assert one.headers["x-model"] == two.headers["x-model"]
    # Every image went as pixels the front-ends decoded (3 + 2 + 2 + 1 + 1 + 1); the engine encoded
    # red and blue once for tiny (its cache had them afterwards) and red once for dense, from those pixels.
    assert metric_value(split.url, "clip_frontend_predecoded_images_total") == sent + 10
    assert metric_value(split.url, "clip_predecoded_images_total", outcome="used") == used + 3


def test_bad_images_get_the_answer_of_one_process(single: Any, split: Split, make_image: Any) -> None:
    good = make_image("cross", "green")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/embed", {"images": [good, {"data": good["data"][:-3] + "!!!"}]}),  # malformed base64
        ("/embed", {"images": [{"data": base64.b64encode(b"not an image").decode()}]}),
        ("/embed", {"images": [{"data": good["data"], "url": "http://example.com/x.png"}]}),
        ("/classify", {"images": [good], "labels": ["only one"]}),
        ("/embed", {"images": [good], "model": "nosuch"}),
        ("/score/dense/heatmap", {"image": good, "text": "a green cross", "model": "dense@production"}),
        ("/embed", {"images": [{"data": "A" * (21 * 1024 * 1024)}]}),  # over the body limit: 413
    ]
    for path, body in cases:
        one, two = (
            httpx.post(single.url + path, json=body, timeout=60),
            httpx.post(split.url + path, json=body, timeout=60),
        )
        assert one.status_code == two.status_code, (path, body.keys(), two.text)
        if one.headers["content-type"].startswith("application/json"):
            assert one.json() == two.json()
    multipart = {"images": ("x.png", base64.b64decode(good["data"]), "image/png")}
    one = httpx.post(f"{single.url}/embed", files=multipart, timeout=60)
    two = httpx.post(f"{split.url}/embed", files=multipart, timeout=60)
    assert (one.status_code, two.status_code) == (200, 200) and one.json() == two.json()


def test_a_client_cannot_hand_the_engine_pixels_nor_read_its_internals(split: Split, make_image: Any) -> None:
    body = {"images": [make_image("circle", "green")]}
    plain = httpx.post(f"{split.url}/embed", json=body, timeout=60)
    forged = httpx.post(f"{split.url}/embed", json=body, headers={"x-clip-predecoded": "12"}, timeout=60)
    assert forged.status_code == 200 and forged.json() == plain.json()
    internal = httpx.get(f"{split.url}/_engine/preprocessing", headers={"x-clip-front-end": "1"})
    assert internal.status_code == 404


def test_metrics_is_one_scrape_of_the_engine_and_the_front_ends(split: Split) -> None:
    text = httpx.get(f"{split.url}/metrics").text
    for series in ("clip_images_decoded_total", "clip_batch_size_bucket", "clip_frontend_requests_total",
                   "clip_predecoded_images_total"):  # fmt: skip
        assert f"\n{series}" in text, series
    assert text.count("# TYPE clip_frontend_requests_total counter") == 1


def _children(split: Split) -> list[int]:
    return [int(c) for c in Path(f"/proc/{split.process.pid}/task/{split.process.pid}/children").read_text().split()]


def _front_ends(split: Split) -> list[int]:
    return [c for c in _children(split) if b"service.split.frontend" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_pixels_past_the_inline_size_cross_by_shared_memory(single: Any, split: Split, make_image: Any) -> None:
    from service.split.pixel_ring import MIN_SHARED_BYTES, SHM_DIR

    # three distinct 64 px images: 36 KiB of pixels, past MIN_SHARED_BYTES (one alone stays inline)
    images = [make_image("circle", "green", x=0.2), make_image("square", "red", x=0.7), make_image("cross", "blue")]
    assert 3 * 64 * 64 * 3 >= MIN_SHARED_BYTES > 64 * 64 * 3
    rings = {pid: list(SHM_DIR.glob(f"clip-pixels-{pid}-*")) for pid in _front_ends(split)}
    assert all(len(found) == 1 for found in rings.values()), rings  # one ring per front-end
    used = metric_value(split.url, "clip_predecoded_images_total", outcome="used")
    for _ in range(4):  # over both front-ends, most likely; each answer frees its region for the next
        one = httpx.post(f"{single.url}/embed", json={"images": images}, timeout=60)
        two = httpx.post(f"{split.url}/embed", json={"images": images}, timeout=60)
        assert (one.status_code, two.status_code) == (200, 200), two.text
        close(one.json(), two.json())
    assert metric_value(split.url, "clip_predecoded_images_total", outcome="used") == used + 3  # cached after


def test_a_front_end_that_dies_ends_the_service(split: Split) -> None:
    """Last of the tests on the module's service: it stops it."""
    from service.split.pixel_ring import SHM_DIR

    children = _children(split)
    frontend = _front_ends(split)[0]
    os.kill(frontend, signal.SIGKILL)
    assert split.process.wait(timeout=60) != 0
    assert "exited with code -9: stopping the service" in split.log.read_text()
    for child in children:  # the engine and the other front-end were stopped too
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child}").exists() and b"zombie" not in _state(child):
            assert time.monotonic() < deadline, f"process {child} outlived the service"
            time.sleep(0.1)
    deadline = time.monotonic() + 30
    while list(SHM_DIR.glob(f"clip-pixels-{frontend}-*")):  # the killed one's ring goes with it
        assert time.monotonic() < deadline, "a dead front-end's shared memory was left behind"
        time.sleep(0.1)


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes().lower()
    except OSError:
        return b"zombie"


def test_a_hot_swap_is_followed_and_sigterm_drains(tmp_path: Path, serve_app: Any, make_image: Any) -> None:
    root = tmp_path / "store"
    publish_tiny(root, "swap", seed=3)
    env = {"CLIP_STORE": str(root), "CLIP_MODEL": "swap@production", "CLIP_WATCH_INTERVAL_S": "0.3",
           "CLIP_BATCHING__MAX_WAIT_MS": "800"}  # fmt: skip
    body = {"images": [make_image("circle", "red", x=0.4)]}
    with split_service(tmp_path / "service.log", **env) as split:
        first = httpx.post(f"{split.url}/embed", json=body, timeout=60)
        assert first.status_code == 200 and first.headers["x-model"].startswith("swap@")
        # Another version, with other preprocessing: the front-ends must decode for it from now on.
        version = publish_tiny(root, "swap", seed=4, resize_mode="squash")
        deadline = time.monotonic() + 60
        while (r := httpx.post(f"{split.url}/embed", json=body, timeout=60)).headers["x-model"] != f"swap@{version}":
            assert time.monotonic() < deadline, "the swap was not followed"
            time.sleep(0.2)
        with serve_app(store=str(root), model="swap@production") as single:
            expected = httpx.post(f"{single.url}/embed", json=body, timeout=60).json()
        close(expected, r.json())
        # SIGTERM while a request waits in the engine's batcher: it is answered, then all exit 0.
        results: list[int] = []
        late = {"images": [make_image("square", "blue", x=0.6)]}
        call = threading.Thread(
            target=lambda: results.append(httpx.post(f"{split.url}/embed", json=late, timeout=60).status_code)
        )
        call.start()
        time.sleep(0.3)
        split.process.send_signal(signal.SIGTERM)
        call.join(timeout=60)
        assert split.process.wait(timeout=60) == 0, split.log.read_text()[-3000:]
    assert results == [200]
