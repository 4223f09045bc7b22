"""Optional API keys: 401 without or with a malformed header, 403 for a wrong key, probes open."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.auth import ApiKeyAuth
from service.config import Settings


@pytest.fixture(scope="module")
def keyfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "keys"
    path.write_text("# mounted secret\nfile-key-1\n\n")
    return path


@pytest.fixture(scope="module")
def secured(serve_app: Any, tiny_store: Path, keyfile: Path) -> Iterator[str]:
    with serve_app(
        store=str(tiny_store), model="tiny@production", api_keys=["static-key"], api_keys_file=keyfile
    ) as running:
        yield running.url


def error_code(r: httpx.Response) -> str:
    return str(r.json()["error"]["code"])


def test_missing_or_malformed_header_is_401(secured: str) -> None:
    for headers in (
        {},
        {"Authorization": "static-key"},
        {"Authorization": "Basic c3RhdGljLWtleQ=="},
        {"Authorization": "Bearer"},
    ):
        r = httpx.post(f"{secured}/embed", json={"texts": ["a"]}, headers=headers)
        assert r.status_code == 401, headers
        assert error_code(r) == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"


def test_wrong_key_is_403(secured: str) -> None:
    r = httpx.post(f"{secured}/embed", json={"texts": ["a"]}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and error_code(r) == "forbidden"


def test_auth_comes_before_validation(secured: str) -> None:
    r = httpx.post(f"{secured}/classify", content=b"{broken", headers={"content-type": "application/json"})
    assert r.status_code == 401
    assert httpx.get(f"{secured}/models").status_code == 401
    assert httpx.get(f"{secured}/nope").status_code == 401  # routes are not revealed either


def test_valid_keys_from_settings_and_file(secured: str, keyfile: Path) -> None:
    for key in ("static-key", "file-key-1"):
        r = httpx.post(f"{secured}/embed", json={"texts": ["a"]}, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, key
    assert httpx.get(f"{secured}/models", headers={"Authorization": "bearer static-key"}).status_code == 200


def test_key_file_rotation(secured: str, keyfile: Path) -> None:
    keyfile.write_text("file-key-2\n")
    stamp = time.time() + 5  # a distinct mtime even on coarse filesystems
    os.utime(keyfile, (stamp, stamp))
    headers = {"Authorization": "Bearer file-key-2"}
    assert httpx.post(f"{secured}/embed", json={"texts": ["a"]}, headers=headers).status_code == 200
    old = {"Authorization": "Bearer file-key-1"}
    assert httpx.post(f"{secured}/embed", json={"texts": ["a"]}, headers=old).status_code == 403


def test_probes_and_metrics_need_no_key(secured: str) -> None:
    assert httpx.get(f"{secured}/healthz").status_code == 200
    ready = httpx.get(f"{secured}/readyz")
    # The public probe names no model unless probes_list_models: /models, behind the key, does.
    assert ready.status_code == 200 and ready.json()["model"] is None and ready.json()["models"] == []
    assert "tiny" not in ready.text
    listed = httpx.get(f"{secured}/models", headers={"Authorization": "Bearer static-key"}).json()
    assert [m["ref"] for m in listed["served"]] == ["tiny@production"]
    assert httpx.get(f"{secured}/metrics").status_code == 200
    assert httpx.get(f"{secured}/openapi.json").status_code == 200


def test_auth_off_without_keys() -> None:
    auth = ApiKeyAuth(Settings())
    assert not auth.enabled
    auth.check(None)  # no exception


def test_missing_key_file_fails_at_startup(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="api_keys_file"):
        ApiKeyAuth(Settings(api_keys_file=tmp_path / "absent"))


def test_a_non_ascii_key_matches_its_utf8_bytes(serve_app: Any, tiny_store: Path) -> None:
    with serve_app(store=str(tiny_store), model="tiny@production", api_keys=["clé-sécrète-ü"]) as running:
        good = {"Authorization": "Bearer clé-sécrète-ü".encode()}  # header bytes as UTF-8
        r = httpx.post(f"{running.url}/embed", json={"texts": ["a"]}, headers=good)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        wrong = {"Authorization": "Bearer clé-sécrète-u".encode()}
        assert httpx.post(f"{running.url}/embed", json={"texts": ["a"]}, headers=wrong).status_code == 403  # type: ignore[arg-type]
        assert "HTTPBearer" in httpx.get(f"{running.url}/openapi.json").json()["components"]["securitySchemes"]


def test_an_open_server_declares_no_bearer_scheme(base_url: str) -> None:
    schema = httpx.get(f"{base_url}/openapi.json").json()
    assert "securitySchemes" not in schema.get("components", {})
    assert not any(op.get("security") for item in schema["paths"].values() for op in item.values())
