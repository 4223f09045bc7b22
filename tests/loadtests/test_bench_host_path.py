"""``loadtests.bench_host_path``: every image wrk sends is new bytes that decode to its base scene,
and the script's parts (base64 split, variants, tables) say what they should."""

from __future__ import annotations

import base64
import http.server
import io
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from loadtests.bench_host_path import (
    COUNTER_AT,
    COUNTER_LEN,
    Cell,
    WrkResult,
    base_jpegs,
    body_template,
    counter_bytes,
    endpoint_table,
    image_base64,
    parse_variant,
    read_bases,
    run_wrk,
    split_base64,
    with_counter_segment,
    write_bases,
)
from loadtests.run import DIFFERENCE, LABELS_20


def pixels(jpeg: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))


def test_the_counter_is_base64_on_its_own_and_leaves_the_picture_alone() -> None:
    (jpeg,) = base_jpegs(1)
    assert jpeg[:2] == b"\xff\xd8" and jpeg[2:4] == b"\xff\xfe"  # SOI, then the comment segment
    assert jpeg[COUNTER_AT : COUNTER_AT + COUNTER_LEN] == b"0" * COUNTER_LEN
    assert COUNTER_AT % 3 == 0 and COUNTER_LEN % 3 == 0
    parts = split_base64(jpeg)
    assert image_base64(parts, b"0" * COUNTER_LEN) == base64.b64encode(jpeg).decode()  # padding only at the end
    other = base64.b64decode(image_base64(parts, counter_bytes(12, 3, 456789)))
    assert other != jpeg and other[COUNTER_AT : COUNTER_AT + COUNTER_LEN] == b"001203000456789"
    assert Image.open(io.BytesIO(other)).info["comment"] == b"001203000456789"
    assert np.array_equal(pixels(other), pixels(jpeg))
    with pytest.raises(ValueError, match="SOI"):
        with_counter_segment(b"\x89PNG")


def test_service_variants_are_parsed_from_name_and_environment() -> None:
    assert parse_variant("torch-fp32").env == {}
    variant = parse_variant("d4:CLIP_BATCHING__DECODE_WORKERS=4,CLIP_PRECISION=auto")
    assert (variant.name, variant.env) == ("d4", {"CLIP_BATCHING__DECODE_WORKERS": "4", "CLIP_PRECISION": "auto"})
    for bad in ("infinity", "x:CLIP_PRECISION", "a b:X=1", ":X=1"):
        with pytest.raises(Exception, match="ENV=VALUE"):
            parse_variant(bad)


def _result(rate: float, failed: int = 0) -> WrkResult:
    return WrkResult(ok=int(rate * 10), status_503=failed, status_other=0, socket_errors=0, requests=int(rate * 10),
                     images_sent=0, duration_s=10.0, p50_ms=2.0, p90_ms=3.0, p99_ms=4.0, wrk_cpu_s=0.5)  # fmt: skip


def test_the_table_puts_rounds_side_by_side_and_divides_medians() -> None:
    cells = [
        Cell("torch-fp32", 1, "rank-pair", 8, 2, _result(100)),
        Cell("torch-fp32", 2, "rank-pair", 8, 2, _result(120)),
        Cell("infinity", 1, "rank-pair", 8, 2, _result(50, failed=3)),
        Cell("infinity", 2, "rank-pair", 8, 2, _result(60)),
    ]
    out = endpoint_table("rank-pair", cells, ["torch-fp32", "infinity"], [8], ceiling=1000.0, processes=2)
    cells_of = (line.strip("|").split("|") for line in out.splitlines() if line.startswith("| "))
    rows = {label.strip(): value.strip() for label, value in cells_of}
    assert rows["torch-fp32"] == "100 / 120 (2.0 / 4.0)"
    assert rows["torch-fp32 / infinity (medians)"] == "**2.00x**"
    assert rows["torch-fp32: % of decode-only ceiling (2 proc.)"] == "22%"  # 110 req/s x 2 images of 1000
    assert rows["infinity: non-2xx + socket errors"] == "3"
    assert rows["torch-fp32: wrk CPU ms per request"] == "0.458"  # median of 0.5 s over 1000 and 1200 requests


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Keeps the first bodies; answers 200, except every 5th request 503 and every 7th 400."""

    protocol_version = "HTTP/1.1"
    bodies: list[bytes] = []
    seen = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        cls.seen += 1
        if len(cls.bodies) < 40:
            cls.bodies.append(body)
        status = (
            "503 Service Unavailable" if cls.seen % 5 == 0 else "400 Bad Request" if cls.seen % 7 == 0 else "200 OK"
        )
        self.wfile.write(f"HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\n{{}}".encode())  # one write: no Nagle wait

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    _Recorder.bodies, _Recorder.seen = [], 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_every_image_wrk_sends_is_new_bytes_of_its_base_scene(tmp_path: Path, recorder: str) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    jpegs = base_jpegs(3)
    write_bases(tmp_path / "bases.txt", jpegs)
    assert read_bases(tmp_path / "bases.txt") == [split_base64(j) for j in jpegs]
    path, body = body_template("service", "rank-pair")
    (tmp_path / "body.json").write_text(body + "\n")
    result = run_wrk(recorder + path, tmp_path / "bases.txt", tmp_path / "body.json", cell=42, concurrency=2,
                     duration_s=1)  # fmt: skip
    assert result.requests > 10 and result.ok + result.status_503 + result.status_other == result.requests
    assert result.status_503 > 0 and result.status_other > 0 and result.socket_errors == 0
    assert result.duration_s >= 1 and 0 < result.p50_ms <= result.p99_ms and result.wrk_cpu_s > 0
    images = []
    for raw in _Recorder.bodies:
        request = json.loads(raw)
        assert request["difference"] == DIFFERENCE
        images += [base64.b64decode(request[side]["data"], validate=True) for side in ("image_a", "image_b")]
    assert len(images) >= 20 and len(set(images)) == len(images)  # no two images share bytes
    for image in images[:6]:
        counter = Image.open(io.BytesIO(image)).info["comment"].decode()
        assert re.fullmatch(r"0042(0[01])\d{9}", counter), counter  # cell 42, wrk thread, image number
        base = jpegs[int(counter[6:]) % len(jpegs)]
        assert (
            image[:COUNTER_AT] == base[:COUNTER_AT]
            and image[COUNTER_AT + COUNTER_LEN :] == base[COUNTER_AT + COUNTER_LEN :]
        )
        assert np.array_equal(pixels(image), pixels(base))


def test_each_server_gets_its_own_body_shape() -> None:
    image = "@IMG@"
    assert body_template("service", "embed") == ("/embed", json.dumps({"images": [{"data": image}]}))
    path, body = body_template("service", "classify")
    assert path == "/classify" and json.loads(body) == {"images": [{"data": image}], "labels": LABELS_20}
    path, body = body_template("infinity", "embed")
    assert path == "/embeddings"
    assert json.loads(body) == {"input": [f"data:image/jpeg;base64,{image}"], "modality": "image", "model": "clip"}
    with pytest.raises(ValueError):
        body_template("infinity", "classify")
