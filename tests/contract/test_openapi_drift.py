"""The committed contract (``clients/openapi.json``) and the generated docs match the code.

A failure here means the API (or a setting) changed without its contract being regenerated:
run ``python scripts/export_openapi.py`` (and ``--config-doc``), review the diff, commit both.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
API_DOC = REPO / "docs" / "api.md"
# docs/design.md, section 2: every one of these is part of the public contract.
DESIGN_OPERATIONS = [
    ("post", "/classify"),
    ("post", "/rank-pair"),
    ("post", "/rank"),
    ("post", "/embed"),
    ("get", "/models"),
    ("get", "/models/{name}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
]
LATER_OPERATIONS = [("post", "/score/dense")]  # checked once the app serves it


def _load_exporter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_openapi", REPO / "scripts" / "export_openapi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exporter() -> ModuleType:
    return _load_exporter()


@pytest.fixture(scope="module")
def schema(exporter: ModuleType) -> dict[str, Any]:
    return exporter.build_schema()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    path = REPO / "clients" / "openapi.json"
    assert path.exists(), "clients/openapi.json is missing; create it with: python scripts/export_openapi.py"
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_committed_openapi_matches_the_app(exporter: ModuleType, schema: dict[str, Any]) -> None:
    committed_text = (REPO / "clients" / "openapi.json").read_text(encoding="utf-8")
    if committed_text == exporter.render(schema):
        return
    changes = exporter.diff_summary(json.loads(committed_text), schema)
    pytest.fail(
        "clients/openapi.json differs from the app's OpenAPI schema "
        f"({len(changes)} change(s) shown, committed -> app):\n  "
        + "\n  ".join(changes or ["(formatting only)"])
        + "\nRegenerate it with `python scripts/export_openapi.py`, review the diff and commit it."
    )


@pytest.mark.parametrize(("method", "path"), DESIGN_OPERATIONS, ids=[f"{m} {p}" for m, p in DESIGN_OPERATIONS])
def test_design_operation_is_in_the_contract(
    schema: dict[str, Any], committed: dict[str, Any], method: str, path: str
) -> None:
    assert method in schema["paths"].get(path, {}), f"the app does not serve {method.upper()} {path}"
    assert method in committed["paths"].get(path, {}), f"clients/openapi.json lacks {method.upper()} {path}"


@pytest.mark.parametrize(("method", "path"), LATER_OPERATIONS, ids=[f"{m} {p}" for m, p in LATER_OPERATIONS])
def test_later_operation_is_in_the_contract_once_served(
    schema: dict[str, Any], committed: dict[str, Any], method: str, path: str
) -> None:
    if method not in schema["paths"].get(path, {}):
        pytest.skip(f"{method.upper()} {path} is not served yet")
    assert method in committed["paths"].get(path, {}), f"clients/openapi.json lacks {method.upper()} {path}"


def test_every_operation_documents_its_errors_with_the_envelope(exporter: ModuleType, schema: dict[str, Any]) -> None:
    problems, _ = exporter.audit(schema)
    assert not problems, "error responses missing from the OpenAPI schema:\n  " + "\n  ".join(problems)


def test_error_envelope_schema(schema: dict[str, Any]) -> None:
    schemas = schema["components"]["schemas"]
    assert schemas["ErrorResponse"]["required"] == ["error"]
    assert set(schemas["ErrorDetail"]["properties"]) == {"code", "message", "field"}


def test_api_reference_covers_every_operation_and_error_code(schema: dict[str, Any]) -> None:
    from service.api.errors import STATUS, ErrorCode

    text = API_DOC.read_text(encoding="utf-8")
    for path, item in schema["paths"].items():
        for method in item:
            assert f"{method.upper()} {path}" in text, f"docs/api.md does not document {method.upper()} {path}"
    for code in ErrorCode:
        row = re.search(rf"^\|\s*`{code.value}`\s*\|\s*{STATUS[code]}\s*\|", text, re.MULTILINE)
        assert row, f"docs/api.md has no error-table row for `{code.value}` ({STATUS[code]})"


def test_configuration_doc_is_current(exporter: ModuleType) -> None:
    from config_doc import config_doc  # beside the exporter, on sys.path once it is loaded

    current = exporter.CONFIG_DOC_PATH.read_text(encoding="utf-8") if exporter.CONFIG_DOC_PATH.exists() else ""
    assert current == config_doc(), (
        "docs/configuration.md is out of date with service/config.py or service/cli.py; "
        "regenerate it with `python scripts/export_openapi.py --config-doc`"
    )


def test_the_api_version_is_the_package_version(schema: dict[str, Any]) -> None:
    """One version: /openapi.json, clients/openapi.json and `--version` say the same (it said 1.0
    beside the package's 0.1.0)."""
    from model_store.version import package_version

    assert schema["info"]["version"] == package_version()
