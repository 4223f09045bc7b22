"""Errors that say what happened and what to do: an unknown path or method on the real service,
and the SDK against a server that is down or a base_url with a wrong path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clipdiff import Client, ConnectionFailed, NotFound

REPO = Path(__file__).resolve().parents[2]


def test_an_unknown_path_names_itself_and_where_the_endpoints_are(base_url: str) -> None:
    r = httpx.post(f"{base_url}/rnak-pair", json={})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "not_found"
    assert error["message"] == "no endpoint POST /rnak-pair; the API's endpoints are listed at /docs and /openapi.json"


def test_a_wrong_method_names_the_methods_the_path_takes(base_url: str) -> None:
    r = httpx.get(f"{base_url}/rank-pair")
    assert r.status_code == 405
    assert r.json()["error"]["message"] == "GET /rank-pair is not allowed; this path takes POST"


def test_the_sdk_names_the_url_of_a_server_that_is_down() -> None:
    with socket.socket() as probe:  # a 127.0.0.1 port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", max_retries=0) as client, pytest.raises(ConnectionFailed) as info:
        client.rank_pair(b"\x89PNG", b"\x89PNG", "larger")
    text = str(info.value)
    assert f"POST http://127.0.0.1:{port}/rank-pair" in text and "check that the service is running there" in text


def test_the_sdk_with_a_wrong_base_path_says_which_url_was_not_found(base_url: str) -> None:
    with Client(f"{base_url}/api/v2", max_retries=0) as client, pytest.raises(NotFound) as info:
        client.models()
    assert info.value.url == f"GET {base_url}/api/v2/models"
    assert f"GET {base_url}/api/v2/models" in str(info.value) and "no endpoint GET /api/v2/models" in str(info.value)


@pytest.mark.slow
def test_a_port_in_use_is_refused_at_once_with_what_to_do(tiny_store: Path) -> None:
    """It exited 3 after 12.8 s (the model load) with uvicorn's errno text; now before the model
    load and before importing torch, naming the address and the --port flag."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "service", "--port", str(port), "--store", str(tiny_store),
             "--model", "tiny@production"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "--port (CLIP_PORT)" in proc.stderr, proc.stderr
    assert "loaded" not in proc.stderr  # refused before the model was loaded
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "uvicorn" in imported and "torch" not in imported  # and before the seconds of importing torch


def test_a_count_below_its_minimum_reads_as_english(base_url: str) -> None:
    """It said "texts needs at least 1 texts, got 0"."""
    from service.api.validation import check_count

    with pytest.raises(Exception, match="^texts needs at least one text, got none$"):
        check_count([], "texts", 1, 10, "texts")
    with pytest.raises(Exception, match="^images needs at least 2 images, got one image$"):
        check_count([0], "images", 2, 10, "images")
    r = httpx.post(f"{base_url}/classify", json={"images": [], "labels": ["a", "b"]})
    assert r.status_code in (400, 422) and "1 images" not in r.text
