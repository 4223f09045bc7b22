"""Schemathesis hooks of tests/contract/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

The run uses every check, positive_data_acceptance and negative_data_rejection included: a
request the schema admits must not be refused with a 4xx for a reason the schema could state,
and one it does not admit must be refused. Two kinds of verdicts are corrected here, each
narrowly.

Refusals no schema fixed at build time can state. They depend on

* the server's settings: its limits (413, see GET /limits) and whether it fetches image URLs;
* the serving model version: its text encoders, its embedding width, its family;
* the content: whether image bytes decode as a picture;
* other parts of the request: labels that ``descriptions`` and ``comparatives`` name, the
  ``?comparative=true`` query that ``comparatives`` and ``method`` depend on, and a collection
  add's form, whose ``items`` part has one entry per file of its ``images``.

``UNSTATABLE`` lists them by error code and field, each with its reason; a schema-valid request
refused with one of them is not a failure, and every other refusal still is. So that fuzzing
reaches the scoring code rather than stopping at those checks each time, positive requests get
decodable images and /classify's descriptions and comparatives name its labels (``map_case``).

Requests the tool labels wrongly. A verdict is about the request that was sent, judged by an
independent validator (jsonschema-rs, OpenAPI 3.1's JSON Schema draft) against the operation's
schema: a "positive" request that does not fit it is not positive data (the tool's coverage
phase drops an image object's oneOf now and then, and its examples phase assembles a form from
property examples that break the form's oneOf), and a "negative" one that does fit it is not
negative data. A form is read as a server reads the wire: every part is text (an item mutated
to an array is sent as its JSON text, a valid string), an empty list sends no part at all, and
number, boolean and JSON-encoded fields are read as JSON.
"""

from __future__ import annotations

import base64
import json
import re
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import jsonschema_rs
import schemathesis
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.core.parameters import ParameterLocation
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.transport.serialization import Binary

from service.api.schemas import EXAMPLE_PNG

PNG = base64.b64decode(EXAMPLE_PNG)
FORM = "multipart/form-data"

# (error code, the field as a regex (None: any), why a valid request may get it)
UNSTATABLE: list[tuple[str, str | None, str]] = [
    ("payload_too_large", None, "a configured limit (GET /limits); limits are settings"),
    ("urls_disabled", None, "whether the server fetches image URLs is a setting"),
    ("url_forbidden", None, "where a URL's host resolves, and the server's allowlist"),
    ("bad_image", None, "whether the bytes decode as a picture"),
    ("bad_input", r"encoder", "the serving version's text encoders (GET /models)"),
    ("bad_input", r"dimensions", "the serving model's embedding width"),
    ("bad_input", r"descriptions\..*", "a description's key must be one of the request's labels"),
    ("bad_input", r"comparatives(\.\d+(\.[ab])?)?", "labels named elsewhere in the body; ?comparative=true"),
    ("bad_input", r"method", "method 'yukino' with ?comparative=true, a query the body cannot see"),
    ("unsupported_for_family", None, "the serving model's family"),
    ("validation_error", r"items", "a collection add's form: one entry of its items part per image file"),
]


# ----------------------------------------------------------------------------- realistic positive data
@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    body = case.body
    if _is_form(case):
        for name, value in body.items():
            if isinstance(value, (Binary, bytes)):
                body[name] = PNG
            elif isinstance(value, list) and value and all(isinstance(v, (Binary, bytes)) for v in value):
                body[name] = [PNG] * len(value)
        _one_item_per_file(body)
    _decodable_images(body)
    _labels_named_elsewhere(body)
    return case


def _one_item_per_file(body: dict[str, Any]) -> None:
    """A collection add's form: as many ``items`` entries as ``images`` files."""
    images, items = body.get("images"), body.get("items")
    if isinstance(images, list) and images and isinstance(items, list) and items:
        body["items"] = [items[i % len(items)] for i in range(len(images))]


def _decodable_images(value: Any) -> None:
    """Image objects given as ``data`` or ``url`` become the example PNG (a ``sha256`` stays)."""
    if isinstance(value, dict):
        if set(value) <= {"data", "url", "sha256"} and any(isinstance(value.get(k), str) for k in ("data", "url")):
            value.update(data=EXAMPLE_PNG, url=None)
        for item in value.values():
            _decodable_images(item)
    elif isinstance(value, list):
        for item in value:
            _decodable_images(item)


def _labels_named_elsewhere(body: dict[str, Any]) -> None:
    """/classify: descriptions and comparatives that name the request's labels."""
    labels = body.get("labels")
    if not (isinstance(labels, list) and len(labels) >= 2 and all(isinstance(x, str) for x in labels)):
        return
    if isinstance(body.get("descriptions"), dict):
        body["descriptions"] = dict(zip(labels, body["descriptions"].values(), strict=False))
    if isinstance(body.get("comparatives"), list):
        for comparative in body["comparatives"]:
            if isinstance(comparative, dict):
                comparative.update(a=labels[0], b=labels[1])


# ----------------------------------------------------------------------------- verdicts
@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep (True) every failure but those the module docstring names."""
    if isinstance(failure, RejectedPositiveData):
        return not (_unstatable(response) or _body_fits(case, response) is False)
    if isinstance(failure, AcceptedNegativeData) and _only_the_body_is_negative(case):
        return _body_fits(case, response) is not True
    return True


def _unstatable(response: Any) -> bool:
    try:
        error = response.json()["error"]
        code, field = str(error["code"]), error["field"]
    except Exception:
        return False
    return any(
        code == c and (pattern is None or (isinstance(field, str) and re.fullmatch(pattern, field) is not None))
        for c, pattern, _ in UNSTATABLE
    )


def _only_the_body_is_negative(case: Any) -> bool:
    meta = case.meta
    return meta is not None and all(
        not info.mode.is_negative for location, info in meta.components.items() if location != ParameterLocation.BODY
    )


def _is_form(case: Any) -> bool:
    return bool(case.media_type) and case.media_type.split(";")[0].strip() == FORM


def _media(case: Any) -> dict[str, Any] | None:
    """The operation's request body entry for the case's media type (schema, encoding)."""
    raw = case.operation.schema.raw_schema
    operation = raw["paths"][case.operation.path][case.operation.method.lower()]
    content = operation.get("requestBody", {}).get("content", {})
    media = content.get((case.media_type or "").split(";")[0].strip())
    return media if isinstance(media, dict) else None


def _body_fits(case: Any, response: Any) -> bool | None:
    """Whether the body that was sent fits the operation's schema (None: cannot tell)."""
    media = _media(case)
    if media is None or "schema" not in media:
        return None
    raw = case.operation.schema.raw_schema
    try:
        sent = _form_as_sent(media, response) if _is_form(case) else case.body
        validator = jsonschema_rs.Draft202012Validator({**media["schema"], "components": raw.get("components", {})})
        return bool(validator.is_valid(sent))
    except Exception:
        return None


def _form_as_sent(media: dict[str, Any], response: Any) -> dict[str, Any]:
    """The form as the wire carries it, read field by field as its schema types it."""
    request = response.request
    content = request.body.encode() if isinstance(request.body, str) else request.body
    header = f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(header + (content or b""))
    parts: dict[str, list[str]] = {}
    for part in message.iter_parts():
        name = str(part.get_param("name", header="content-disposition"))
        payload = part.get_payload(decode=True)
        text = "file" if part.get_filename() is not None else payload.decode(errors="replace")
        parts.setdefault(name, []).append(text)
    properties = media["schema"].get("properties", {})
    encoded = set(media.get("encoding", {}))
    sent: dict[str, Any] = {}
    for name, texts in parts.items():
        schema = properties.get(name, {})
        if name in encoded:
            values = [_json_or_text(t) for t in texts]
        elif schema.get("type") in ("integer", "number", "boolean"):
            values = [_json_or_text(t) for t in texts]
        else:
            values = list(texts)
        # A repeated single field stays a list, which its schema does not admit (nor the server).
        repeated = schema.get("type") == "array" and name not in encoded
        sent[name] = values if repeated or len(values) > 1 else values[0]
    return sent


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
