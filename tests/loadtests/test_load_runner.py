"""The load runner against the real app on the tiny model, and the naive baseline server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from loadtests.run import ImagePool, run_load

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # ``loadtests`` is a folder of scripts, not an installed package

ROW = re.compile(
    r"^\| (?P<endpoint>[^|]+?) \| (?P<requests>\d+) \| (?P<errors>\d+) \| (?P<rate>[\d.]+)% \| "
    r"(?P<rps>[\d.]+) \| (?P<p50>[\d.]+|n/a) \| (?P<p95>[\d.]+|n/a) \| (?P<p99>[\d.]+|n/a) \|$"
)


def parse_table(output: str) -> dict[str, dict[str, float]]:
    rows = {}
    for line in output.splitlines():
        if m := ROW.match(line.strip()):
            rows[m["endpoint"]] = {
                k: float("nan") if v == "n/a" else float(v) for k, v in m.groupdict().items() if k != "endpoint"
            }
    return rows


def run_cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "loadtests" / "run.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_runner_reports_classify_under_load(base_url: str) -> None:
    out = run_cli(
        "--url",
        base_url,
        "--scenario",
        "classify",
        "--concurrency",
        "4",
        "--duration",
        "2",
        "--pool",
        "400",
        "--px",
        "64",
        "--warmup",
        "1",
    )
    rows = parse_table(out)
    assert set(rows) == {"/classify"}, out
    row = rows["/classify"]
    assert row["requests"] > 0 and row["errors"] == 0 and row["rps"] > 0
    assert row["p50"] <= row["p95"] <= row["p99"]


def test_runner_mix_covers_every_endpoint(base_url: str) -> None:
    # The tiny model has no DCSM scorer: /score/dense answers an error, and the runner counts it.
    out = run_cli(
        "--url",
        base_url,
        "--scenario",
        "mix",
        "--concurrency",
        "4",
        "--requests",
        "60",
        "--pool",
        "400",
        "--px",
        "64",
        "--warmup",
        "0",
    )
    rows = parse_table(out)
    assert {"/classify", "/rank-pair", "/embed"} <= set(rows), out
    for name in ("/classify", "/rank-pair", "/embed"):
        assert rows[name]["errors"] == 0, out
    assert sum(r["requests"] for r in rows.values()) == 60
    if "/score/dense" in rows:
        assert rows["/score/dense"]["rate"] == 100.0 and rows["/score/dense"]["p50"] != rows["/score/dense"]["p50"]


def test_runner_refuses_remote_targets() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "loadtests" / "run.py"), "--url", "http://example.com", "--requests", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode != 0 and "127.0.0.1" in proc.stderr


def test_naive_server_answers_the_contract_subset(tiny_store: Path, make_image) -> None:
    from fastapi.testclient import TestClient

    from clipcore.models.bundle import ModelBundle
    from loadtests.naive_server import create_naive_app
    from model_store import ModelStore

    bundle = ModelBundle.load(ModelStore(tiny_store), "tiny@production")
    client = TestClient(create_naive_app(bundle))
    labels = ["red circle", "blue square", "green cross"]
    r = client.post("/classify", json={"images": [make_image(), make_image("square", "blue")], "labels": labels})
    assert r.status_code == 200
    body = r.json()
    assert body["model"] == bundle.ref and len(body["results"]) == 2
    assert sum(x["probability"] for x in body["results"][0]["top_k"]) == pytest.approx(1.0, abs=1e-5)
    r = client.post(
        "/rank-pair",
        json={
            "image_a": make_image(size="large"),
            "image_b": make_image(size="small"),
            "difference": "the first is larger, while the second is smaller.",
        },
    )
    assert r.status_code == 200 and r.json()["first"] in ("a", "b")
    r = client.post("/embed", json={"texts": ["a red circle"]})
    assert r.status_code == 200 and r.json()["dim"] == bundle.embed_dim
    assert client.post("/classify", json={"images": [{"data": "!!"}], "labels": labels}).status_code == 400


def test_runner_hands_each_result_over_and_stops_when_told(base_url: str) -> None:
    stop = threading.Event()
    seen: list[tuple[str, float, int]] = []

    def on_result(endpoint: str, started: float, outcome: httpx.Response | httpx.HTTPError) -> None:
        assert isinstance(outcome, httpx.Response), outcome
        seen.append((endpoint, started, outcome.status_code))
        if len(seen) == 6:
            stop.set()

    result = asyncio.run(run_load(base_url, "embed", concurrency=2, duration_s=60, pool=ImagePool(20, px=64),
                                  on_result=on_result, stop=stop, think_s=0.01))  # fmt: skip
    assert result.wall_s < 30  # stopped long before the duration
    assert len(seen) in (6, 7)  # the other client may finish the request it had sent
    assert {(endpoint, status) for endpoint, _, status in seen} == {("/embed", 200)}
    assert result.endpoints["/embed"].requests == len(seen)
