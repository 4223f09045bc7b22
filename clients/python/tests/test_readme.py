"""The README shows every endpoint of the service's contract, with Python that parses."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
README = (SDK / "README.md").read_text(encoding="utf-8")
CONTRACT = SDK.parent / "openapi.json"  # the service's committed OpenAPI contract


@pytest.mark.skipif(not CONTRACT.exists(), reason="the SDK is outside the service's repository")
def test_every_endpoint_has_a_section() -> None:
    paths = json.loads(CONTRACT.read_text(encoding="utf-8"))["paths"]
    headings = "\n".join(line for line in README.splitlines() if line.startswith("#"))
    missing = [f"{m.upper()} {p}" for p, ops in paths.items() for m in ops if f"`{m.upper()} {p}`" not in headings]
    assert not missing, f"no README section for {missing}"


def test_python_examples_parse() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 10
    for block in blocks:
        ast.parse(block)
