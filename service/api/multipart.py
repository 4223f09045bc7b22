"""Multipart form uploads (``curl -F image_a=@a.png``) on the image endpoints.

A ``multipart/form-data`` request to a route that documents a form (``openapi_form``, see
``form_models``) is turned into the JSON body that endpoint takes, before the route sees it: each
uploaded file becomes ``{"data": <base64>}``, repeated fields (``-F labels=cat -F labels=dog``)
become lists, fields that hold objects (``descriptions``, ``comparatives``, ``pairs``) are parsed
as JSON text, a field the schema types as a number or boolean is read as JSON text when it is one
(``"3"`` -> 3, ``"true"`` -> true), and every other field is passed as its text. The route then
validates, limits and answers exactly as for JSON, so the two forms share every check and error.

The form's schema is the JSON body's, field by field (the same types, bounds, patterns and
list lengths), with files where the body has images and without null, which a form cannot send:
a field left out is the same as null. An empty list sends no part of a repeated field, so in a
form an empty list is a field left out, also as JSON text (``-F pairs=[]``): a list's least
length holds only where the field is required (``openapi_form``).

This runs inside the body cap (the raw upload is counted) and after authentication (an
unauthenticated upload is never parsed). The form parser (python-multipart, through
Starlette) spools large files to disk rather than memory.
"""

from __future__ import annotations

import base64
import enum
import json
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import ErrorCode, error_response
from service.api.schemas import ImageInput
from service.asgi_body import replayed
from service.config import Limits

FORM = "multipart/form-data"
_FORM_BYTES = FORM.encode()  # as the content-type header arrives


class FieldKind(enum.Enum):
    image = "one file"
    images = "files, the field repeated"
    texts = "texts, the field repeated"
    value = "one text"
    json = "JSON text"


def _bare(annotation: Any) -> Any:
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _is_image(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, ImageInput)


def _kind(annotation: Any) -> FieldKind:
    options = [annotation]
    if get_origin(annotation) in (Union, types.UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
    if len(options) != 1:
        return FieldKind.value
    tp = _bare(options[0])
    if _is_image(tp):
        return FieldKind.image
    if get_origin(tp) is list:
        item = _bare(get_args(tp)[0])
        return FieldKind.images if _is_image(item) else FieldKind.texts if item is str else FieldKind.json
    return FieldKind.json if get_origin(tp) is dict else FieldKind.value


REF_TEMPLATE = "#/components/schemas/{model}"  # where FastAPI puts the body's models
_BINARY = {"type": "string", "format": "binary"}
# JSON types a form field's text is read as (when it parses as JSON of that type); the model
# then judges the value (3.0 is an integer, 3.5 is not).
_SCALARS: dict[str, tuple[type, ...]] = {"integer": (int, float), "number": (int, float), "boolean": (bool,)}


@dataclass(frozen=True)
class FormField:
    kind: FieldKind
    schema: dict[str, Any]  # what the form states about the field (see form_fields)

    def typed(self, text: str) -> Any:
        """A one-text field as the body takes it: a number or boolean read as JSON text
        (``"3"``, ``"0.5"``, ``"true"``); otherwise, or if it is not one, the text itself,
        which the model then refuses with the field (``"inf"``, ``"yes"``, ``"null"``)."""
        accepted = _SCALARS.get(self.schema.get("type", ""))
        if accepted is None:
            return text
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return text
        # bool is an int to Python, not a number to JSON: "true" is no integer, "1" no boolean.
        if not isinstance(value, accepted) or isinstance(value, bool) != (bool in accepted):
            return text
        return value


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its null alternative (and a null default): a form has no null."""
    schema = dict(schema)
    options = [o for o in schema.pop("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        schema = {**options[0], **schema}
    elif options:
        schema["anyOf"] = options
    if "default" in schema and schema["default"] is None:
        del schema["default"]
    return schema


def form_fields(model: type[BaseModel]) -> dict[str, FormField]:
    """How each field of a JSON request model is given as a form field, and what its form
    schema states: the body's schema of the field, as files where the body has images."""
    properties = model.model_json_schema(ref_template=REF_TEMPLATE)["properties"]
    fields: dict[str, FormField] = {}
    for name, info in model.model_fields.items():
        kind = _kind(info.annotation)
        body = _without_null(properties[name])
        if kind is FieldKind.image:
            schema = {**_BINARY, **{k: v for k, v in body.items() if k == "description"}}
        elif kind is FieldKind.images:
            schema = {**body, "items": _BINARY}
            schema.pop("examples", None)
        else:
            schema = body
        note = f"form: {kind.value}" + (f"; {schema['description']}" if "description" in schema else "")
        fields[name] = FormField(kind, {**schema, "description": note})
    return fields


class FormError(Exception):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message, self.field = message, field


_UNKNOWN = FormField(FieldKind.value, {})


async def form_body(form: FormData, fields: dict[str, FormField]) -> dict[str, Any]:
    """The JSON body equivalent to ``form``. Unknown fields are passed on, so the schema answers
    a typo with its usual 422."""
    body: dict[str, Any] = {}
    for key in dict.fromkeys(form.keys()):
        values = form.getlist(key)
        field = fields.get(key, _UNKNOWN)
        kind = field.kind
        files = [v for v in values if isinstance(v, UploadFile)]
        if kind in (FieldKind.image, FieldKind.images):
            if len(files) != len(values):
                raise FormError(f"{key} must be a file upload (-F {key}=@picture.png)", key)
            images = [{"data": base64.b64encode(await f.read()).decode("ascii")} for f in files]
            if kind is FieldKind.image and len(images) != 1:
                raise FormError(f"{key} takes one file, got {len(images)}", key)
            body[key] = images if kind is FieldKind.images else images[0]
            continue
        if files:
            raise FormError(f"{key} is a text field, not a file (use -F {key}=text, without @)", key)
        texts = [str(v) for v in values]
        if kind is FieldKind.texts:
            body[key] = texts
        elif len(texts) != 1:
            raise FormError(f"{key} is given {len(texts)} times; it takes one value", key)
        elif kind is FieldKind.json:
            try:
                body[key] = json.loads(texts[0])
            except ValueError as exc:
                raise FormError(f"{key} must be JSON text in a form: {exc}", key) from None
            except RecursionError:  # as in a JSON body: malformed input, not a server fault
                raise FormError(f"{key} is JSON nested too deeply", key) from None
            if body[key] is None:  # a form has no null (its schema says so): leave the field out
                raise FormError(f"{key} is null; leave the field out instead", key)
            if body[key] == [] and field.schema.get("type") == "array":
                del body[key]  # as for a repeated field, whose empty list sends no part: an absent field
        else:
            body[key] = field.typed(texts[0])
    return body


def form_models(routers: Iterable[APIRouter]) -> dict[str, type[BaseModel]]:
    """Path -> JSON body model of every route whose OpenAPI documents a form (``openapi_form``):
    what the contract promises is what the middleware accepts, with no second list to keep."""
    forms: dict[str, type[BaseModel]] = {}
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute) or FORM not in _documented_content(route):
                continue
            body = route.body_field.field_info.annotation if route.body_field is not None else None
            if not (isinstance(body, type) and issubclass(body, BaseModel)):
                raise TypeError(f"{route.path} documents a form but takes no JSON body model")
            # A body whose form differs from it (a collection add: files and one JSON part) names
            # the form's model, which turns the form's fields into the body (``from_form``).
            forms[route.path] = getattr(body, "form_model", body)
    return forms


def _documented_content(route: APIRoute) -> dict[str, Any]:
    return dict((route.openapi_extra or {}).get("requestBody", {}).get("content", {}))


class MultipartFormMiddleware:
    """Rewrites multipart requests to the paths of ``forms`` into their JSON bodies."""

    def __init__(
        self,
        app: ASGIApp,
        limits: Limits,
        forms: dict[str, type[BaseModel]],
        files_by_route: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.fields = {path: form_fields(model) for path, model in forms.items()}
        self.reshape = {path: getattr(model, "from_form", None) for path, model in forms.items()}
        # Paths with parameters (/collections/{name}/images), matched as the router matches them.
        self.templates = [(compile_path(path)[0], path) for path in forms if "{" in path]
        # Beyond these the parser stops at once; within them the route's own checks (413 with the
        # field) apply, as for JSON.
        self.max_files = {path: limits.max_images + 2 for path in forms}
        # Routes whose files are bounded by another setting (a collection add: its items).
        self.max_files.update({path: most + 2 for path, most in (files_by_route or {}).items()})
        self.max_fields = limits.max_labels + limits.max_texts + 64

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope.get("path", "")) if scope["type"] == "http" else None
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
        if route is None or scope.get("method") != "POST" or not content_type.startswith(_FORM_BYTES):
            await self.app(scope, receive, send)
            return
        fields, most_files = self.fields[route], self.max_files[route]
        try:
            async with Request(scope, receive).form(max_files=most_files, max_fields=self.max_fields) as form:
                values = await form_body(form, fields)
                reshape = self.reshape[route] if route is not None else None
                body = json.dumps(values if reshape is None else reshape(values)).encode()
        except FormError as exc:
            await error_response(ErrorCode.validation_error, exc.message, exc.field)(scope, receive, send)
            return
        except MultiPartException as exc:
            await self._unparsable(exc.message, scope, receive, send)
            return
        except HTTPException as exc:  # the body cap (413), or a parser error Starlette wrapped (400)
            if exc.status_code == 413:
                await error_response(ErrorCode.payload_too_large, str(exc.detail))(scope, receive, send)
            else:
                await self._unparsable(str(exc.detail), scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        scope["headers"] = [*headers, (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await self.app(scope, replayed(body, receive), send)

    def _route(self, path: str) -> str | None:
        if path in self.fields:
            return path
        return next((route for pattern, route in self.templates if pattern.match(path)), None)

    @staticmethod
    async def _unparsable(detail: str, scope: Scope, receive: Receive, send: Send) -> None:
        if detail.startswith("Too many"):
            await error_response(ErrorCode.payload_too_large, detail)(scope, receive, send)
        else:
            await error_response(ErrorCode.validation_error, f"multipart body cannot be parsed: {detail}")(
                scope, receive, send
            )


def openapi_form(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route: its multipart form beside the JSON body FastAPI documents."""
    fields = form_fields(model)
    properties = {name: field.schema for name, field in fields.items()}
    required = [n for n in model.model_json_schema().get("required", []) if n in properties]
    # An empty list sends no part at all: in a form, an empty array is an absent field. So an
    # array's minItems holds only where the field is required (by the form, or by the shape that
    # gives it), and a shape that leaves the array out admits it empty.
    least = {
        name: prop["minItems"]
        for name, prop in properties.items()
        if prop.get("type") == "array" and "minItems" in prop and name not in required
    }
    for name in least:
        properties[name] = {k: v for k, v in properties[name].items() if k != "minItems"}
    form_schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        form_schema["required"] = required
    shapes = getattr(model, "documented_shapes", lambda: ())()
    if shapes:
        form_schema["oneOf"] = [_shape_in_a_form(shape.form_schema(), least) for shape in shapes]
    media: dict[str, Any] = {"schema": form_schema}
    # Fields that hold objects are one part of JSON text each (OpenAPI's default for an object;
    # stated, since an array of objects has none).
    encoding = {name: {"contentType": "application/json"} for name, f in fields.items() if f.kind is FieldKind.json}
    if encoding:
        media["encoding"] = encoding
    return {"requestBody": {"content": {FORM: media}}}


def _shape_in_a_form(shape: dict[str, Any], least: dict[str, int]) -> dict[str, Any]:
    """A body shape's form schema with the arrays' bounds of ``openapi_form``: at least their
    minItems where the shape requires them, and none (empty) where it leaves them out."""
    properties = dict(shape.get("properties", {}))
    for name in shape.get("required", []):
        if name in least:
            properties[name] = {"minItems": least[name]}
    for name, schema in shape.get("properties", {}).items():
        if schema is False and name in least:
            properties[name] = {"maxItems": 0}
    return {**shape, "properties": properties}
