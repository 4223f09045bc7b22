"""What the contract admits the server serves, and what it refuses the server refuses.

Each request below is judged twice: by the published OpenAPI schema (jsonschema-rs, with the
JSON Schema draft of OpenAPI 3.1) and by the live server (the tiny model, which has no DCSM
scorer: a valid /score/dense request gets 404 unknown_component). The expected verdict is
written down, so the test also says what the contract states: a schema-valid request must not
be refused with a 4xx, a schema-invalid one must be refused with a 4xx (never a 2xx or a 5xx).

A form is written as its schema reads it and sent as a client writes it: FILE fields as file
uploads, lists as repeated fields, numbers and booleans in their JSON spelling, objects as JSON
text, and a string as it is (so ``"yes"`` for a boolean is sent as the text ``yes``).
"""

from __future__ import annotations

import base64
import itertools
import json
import sys
from typing import Any

import httpx
import pytest

from service.api.schemas import EXAMPLE_PNG

jsonschema_rs = pytest.importorskip("jsonschema_rs")

FILE = object()  # a file upload in a form
IMG = {"data": EXAMPLE_PNG}
HEX = "ab" * 32
LABELS = ["red circle", "blue circle"]
PAIR = {"image_a": IMG, "image_b": IMG, "difference": "the first is red, while the second is blue"}

# (path, query, media, body, the schema admits it)
CASES: list[tuple[str, dict[str, str], str, Any, bool]] = [
    # /classify: texts, templates, images, JSON types
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS}, True),
    ("/classify", {}, "json", {"images": [IMG], "labels": ["red circle", ""]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": ["red circle", " \t"]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": ["red circle", "red circle"]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "templates": ["a photo"]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "templates": ["a {} and a {}"]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "templates": ["a {{}} of a {}"]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "templates": ["a drawing of a {}."]}, True),
    ("/classify", {}, "json", {"images": [{"data": None}], "labels": LABELS}, False),
    ("/classify", {}, "json", {"images": [{"data": ""}], "labels": LABELS}, False),
    ("/classify", {}, "json", {"images": [{"data": EXAMPLE_PNG, "url": None}], "labels": LABELS}, True),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "descriptions": {"red circle": [""]}}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "descriptions": {"red circle": ["round"]}}, True),
    ("/classify", {"comparative": "true"}, "json",
     {"images": [IMG], "labels": LABELS, "comparatives": [{"a": "red circle", "b": "blue circle", "text": ""}]}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "top_k": "3"}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "top_k": 3.0}, True),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "symmetric": 1}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "alpha": "0.5"}, False),
    ("/classify", {}, "json", {"images": [IMG], "labels": LABELS, "gate_margin": None}, True),
    # /embed: exactly one of texts or images, encoder with texts only
    ("/embed", {}, "json", {}, False),
    ("/embed", {}, "json", {"texts": ["a red circle"]}, True),
    ("/embed", {}, "json", {"texts": [""]}, False),
    ("/embed", {}, "json", {"texts": ["a red circle"], "images": None}, True),
    ("/embed", {}, "json", {"texts": ["a red circle"], "images": [IMG]}, False),
    ("/embed", {}, "json", {"images": [IMG], "encoder": "base"}, False),
    ("/embed", {}, "json", {"images": [IMG], "encoder": None}, True),
    # /rank-pair: one pair or a list of pairs, not both
    ("/rank-pair", {}, "json", PAIR, True),
    ("/rank-pair", {}, "json", {"pairs": [PAIR]}, True),
    ("/rank-pair", {}, "json", {**PAIR, "pairs": [PAIR]}, False),
    ("/rank-pair", {}, "json", {"image_a": IMG, "pairs": [PAIR]}, False),
    ("/rank-pair", {}, "json", {**PAIR, "pairs": None}, True),
    ("/rank-pair", {}, "json", {**PAIR, "difference": ""}, False),
    ("/rank-pair", {}, "json", {"pairs": [{**PAIR, "difference": " "}]}, False),
    # /rank, /score/dense, /score/dense/heatmap
    ("/rank", {}, "json", {"images": [IMG, IMG], "difference": ""}, False),
    ("/rank", {}, "json", {"images": [IMG, IMG], "difference": "\u3000"}, False),
    ("/rank", {}, "json", {"images": [IMG, IMG], "difference": "the first is larger"}, True),
    ("/score/dense", {}, "json", {"image": IMG, "texts": [""]}, False),
    ("/score/dense", {}, "json", {"image": IMG, "texts": ["a red circle"]}, True),
    ("/score/dense/heatmap", {}, "json", {"image": {"sha256": HEX}, "text": "a red circle"}, False),
    ("/score/dense/heatmap", {}, "json", {"image": IMG, "text": ""}, False),
    ("/score/dense/heatmap", {}, "json", {"image": IMG, "text": "a red circle"}, True),
    # /v1/embeddings: strings only (token arrays are refused, and not in the contract)
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": ["a red circle"]}, True),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": "a red circle", "dimensions": 8.0}, True),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": [[]]}, False),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": [1, 2, 3]}, False),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": ""}, False),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": []}, False),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": ["a", "  "]}, False),
    ("/v1/embeddings", {}, "json", {"model": "tiny", "input": "a", "dimensions": 0}, False),
    # forms: typed fields, list minimums, one-of forms, no null
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "top_k": 2, "symmetric": True}, True),
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "symmetric": "yes"}, False),
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "top_k": "two"}, False),
    ("/classify", {"comparative": "true"}, "form", {"images": [FILE], "labels": LABELS, "gate_margin": "inf"}, False),
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "descriptions": {"red circle": ["round"]}}, True),
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "descriptions": None}, False),
    ("/classify", {}, "form", {"images": [FILE], "labels": ["red circle", ""]}, False),
    ("/rank", {}, "form", {"images": [FILE, FILE], "difference": "the first is larger"}, True),
    ("/rank", {}, "form", {"images": [FILE], "difference": "the first is larger"}, False),
    ("/rank", {}, "form", {"difference": "the first is larger"}, False),
    ("/embed", {}, "form", {"texts": ["a red circle"], "encoding_format": "float16"}, True),
    ("/embed", {}, "form", {"texts": ["a red circle"], "images": [FILE]}, False),
    ("/embed", {}, "form", {"images": [FILE], "encoder": "base"}, False),
    ("/rank-pair", {}, "form", {"image_a": FILE, "image_b": FILE, "difference": "the first is red"}, True),
    ("/rank-pair", {}, "form", {"image_a": FILE, "image_b": FILE, "difference": "x", "pairs": [PAIR]}, False),
    ("/rank-pair", {}, "form", {"pairs": [PAIR]}, True),
    # an empty list sends no part (or, as JSON text, "[]"): in a form it is a field left out
    ("/embed", {}, "form", {"images": [FILE], "texts": []}, True),
    ("/embed", {}, "form", {"texts": ["a red circle"], "images": []}, True),
    ("/embed", {}, "form", {"texts": []}, False),
    ("/rank-pair", {}, "form", {"image_a": FILE, "image_b": FILE, "difference": "the first is red", "pairs": []}, True),
    ("/rank-pair", {}, "form", {"pairs": []}, False),
    ("/classify", {}, "form", {"images": [FILE], "labels": LABELS, "templates": [], "comparatives": []}, True),
    ("/classify", {}, "form", {"images": [], "labels": LABELS}, False),
    ("/score/dense", {}, "form", {"image": FILE, "texts": ["a red circle"], "return_maps": True}, True),
    ("/score/dense", {}, "form", {"image": FILE, "texts": ["a red circle"], "return_maps": "1"}, False),
]  # fmt: skip

FORM = "multipart/form-data"


@pytest.fixture(scope="module")
def spec(base_url: str) -> dict[str, Any]:
    return httpx.get(f"{base_url}/openapi.json", timeout=30).json()  # type: ignore[no-any-return]


def _media(spec: dict[str, Any], path: str, media: str) -> dict[str, Any]:
    content = spec["paths"][path]["post"]["requestBody"]["content"]
    return content["application/json" if media == "json" else FORM]  # type: ignore[no-any-return]


def _as_schema_reads_it(value: Any) -> Any:
    if value is FILE:
        return "file"
    if isinstance(value, list):
        return [_as_schema_reads_it(v) for v in value]
    return value


def _form_parts(body: dict[str, Any]) -> list[tuple[str, Any]]:
    png = base64.b64decode(EXAMPLE_PNG)
    parts: list[tuple[str, Any]] = []
    for name, value in body.items():
        for item in value if isinstance(value, list) and name != "pairs" else [value]:
            if item is FILE:
                parts.append((name, (f"{name}.png", png, "image/png")))
            elif isinstance(item, str):
                parts.append((name, (None, item)))
            else:
                parts.append((name, (None, json.dumps(item))))
    return parts


def _case_id(case: tuple[str, dict[str, str], str, Any, bool]) -> str:
    path, query, media, body, valid = case
    shown = json.dumps({k: _as_schema_reads_it(v) for k, v in body.items()})
    shown = shown.replace(EXAMPLE_PNG, "PNG")
    return f"{'valid' if valid else 'invalid'} {media} {path}{'?comparative' if query else ''} {shown[:90]}"


@pytest.mark.parametrize(("path", "query", "media", "body", "valid"), CASES, ids=[_case_id(c) for c in CASES])
def test_the_contract_and_the_server_agree(
    base_url: str, spec: dict[str, Any], path: str, query: dict[str, str], media: str, body: Any, valid: bool
) -> None:
    entry = _media(spec, path, media)
    validator = jsonschema_rs.Draft202012Validator({**entry["schema"], "components": spec["components"]})
    read = {k: _as_schema_reads_it(v) for k, v in body.items()}
    assert validator.is_valid(read) == valid, f"the contract {'refuses' if valid else 'admits'} it"

    url = f"{base_url}{path}"
    if media == "json":
        r = httpx.post(url, params=query, json=body, timeout=60)
    else:
        r = httpx.post(url, params=query, files=_form_parts(body), timeout=60)
    if valid:
        served = r.status_code < 400 or r.json()["error"]["code"] == "unknown_component"
        assert served, f"a request the contract admits was refused: {r.status_code} {r.text[:300]}"
    else:
        assert 400 <= r.status_code < 500, f"a request the contract refuses got {r.status_code}: {r.text[:300]}"


def test_the_non_blank_pattern_is_the_servers_rule() -> None:
    """The schema's pattern for texts finds a character in exactly the texts ``str.strip`` leaves
    something of: every code point, whitespace or not by Python's reckoning."""
    from service.api.schemas import NON_BLANK

    for code in range(sys.maxunicode + 1):
        c = chr(code)
        assert (NON_BLANK.search(c) is not None) == bool(c.strip()), hex(code)


def test_the_template_pattern_is_the_servers_rule() -> None:
    """The schema's pattern for templates matches exactly the texts with one ``{}``
    (``str.count``, what the server checks): every text of up to 8 characters over a small alphabet."""
    import re

    from service.api.schemas import TEMPLATE_PATTERN

    pattern = re.compile(TEMPLATE_PATTERN)
    for n in range(9):
        for chars in itertools.product("a{}\n", repeat=n):
            text = "".join(chars)
            assert (pattern.search(text) is not None) == (text.count("{}") == 1), repr(text)


def test_the_base64_pattern_is_the_servers_rule() -> None:
    """The schema's pattern for image ``data`` matches exactly the strings the server decodes
    (``decode_base64``; its size limit aside): every string of up to 8 characters over an
    alphabet of data characters, padding and whitespace, alone and after data: URI heads."""
    import re

    from clipcore.errors import ClipError
    from service.api.schemas import BASE64_PATTERN
    from service.images import decode_base64

    pattern = re.compile(BASE64_PATTERN)

    def decodes(value: str) -> bool:
        try:
            decode_base64(value, "data", max_bytes=1 << 20)
        except ClipError:
            return False
        return True

    heads = ["", "data:image/png;base64,", "data:;base64,", "data:image/png,", "data:a/b;charset=x;base64,",
             "data:;base64x,", "data:image/png;base64 ,", "data:x;base64,", "data:;q;base64;r,"]  # fmt: skip
    for n in range(9):
        for chars in itertools.product("AQ/= \n\u2028-", repeat=n) if n <= 5 else itertools.product("AQ= ", repeat=n):
            text = "".join(chars)
            for head in heads if n <= 4 else [""]:
                value = head + text
                assert (pattern.search(value) is not None) == decodes(value), repr(value)
