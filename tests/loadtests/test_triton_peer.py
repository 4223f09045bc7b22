"""The PyTriton peer of ``loadtests.bench_host_path``: it feeds its tower what the service feeds
its own from the same JPEG, and the benchmark sends it Triton's request shape and compares with it.
(Triton itself runs in a virtualenv of its own, not installed here: its server is not started.)"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from clipcore.models.preprocess import PreprocessConfig
from loadtests.bench_host_path import Cell, WrkResult, base_jpegs, body_template, endpoint_table, parse_variant
from loadtests.peer.pytriton_server import MEAN, STD, preprocess
from loadtests.peer.triton_peer import INFER_PATH, infer_body
from service.images import decode_image

SIDE = 64  # loadtests/tiny_vit.json's image_size


def test_the_peer_gives_its_tower_the_service_s_input_for_the_same_jpeg() -> None:
    config = PreprocessConfig.from_manifest({"mean": MEAN.tolist(), "std": STD.tolist()})
    for jpeg in base_jpegs(3, seed=1):
        image = decode_image(jpeg, "images.0", 10**8, min_side=SIDE)
        service_input = config.normalize(config.fit(image, SIDE)[None]).numpy()[0]
        peer_input = preprocess(base64.b64encode(jpeg), SIDE)
        assert peer_input.shape == service_input.shape == (3, SIDE, SIDE)
        assert np.abs(peer_input - service_input).max() < 1e-5


def test_the_peer_refuses_what_is_not_base64() -> None:
    with pytest.raises(ValueError):
        preprocess(b"not base64!", SIDE)


def test_triton_gets_one_bytes_tensor_per_request_and_embed_only() -> None:
    path, body = body_template("pytriton", "embed")
    assert path == INFER_PATH == "/v2/models/clip_image/infer"
    assert body == infer_body("@IMG@")
    assert json.loads(body) == {"inputs": [{"name": "image", "shape": [1, 1], "datatype": "BYTES", "data": ["@IMG@"]}]}
    with pytest.raises(ValueError, match="embed only"):
        body_template("pytriton", "classify")
    with pytest.raises(Exception, match="not infinity or pytriton"):
        parse_variant("pytriton")


def test_each_variant_is_divided_by_each_peer() -> None:
    def result(rate: float) -> WrkResult:
        return WrkResult(ok=int(rate * 10), status_503=0, status_other=0, socket_errors=0, requests=int(rate * 10),
                         images_sent=0, duration_s=10.0, p50_ms=2.0, p90_ms=3.0, p99_ms=4.0, wrk_cpu_s=0.5)  # fmt: skip

    cells = [Cell("one", 1, "embed", 8, 1, result(100)), Cell("infinity", 1, "embed", 8, 1, result(50)),
             Cell("pytriton", 1, "embed", 8, 1, result(400))]  # fmt: skip
    out = endpoint_table("embed", cells, ["one", "infinity", "pytriton"], [8], ceiling=1000.0, processes=2)
    rows = dict(
        (label.strip(), value.strip())
        for label, value in (line.strip("|").split("|") for line in out.splitlines() if line.startswith("| "))
    )
    assert rows["one / infinity (medians)"] == "**2.00x**"
    assert rows["one / pytriton (medians)"] == "**0.25x**"
    assert "pytriton / infinity (medians)" not in rows
    assert rows["pytriton: % of decode-only ceiling (2 proc.)"] == "40%"
