"""Multipart form uploads (``curl -F image_a=@a.png``) on the image endpoints.

A ``multipart/form-data`` request to a route that documents a form (``openapi_form``, see
``form_models``) is turned into the JSON body that endpoint takes, before the route sees it: each
uploaded file becomes ``{"data": <base64>}``, repeated fields (``-F labels=cat -F labels=dog``)
become lists, fields that hold objects (``descriptions``, ``comparatives``, ``pairs``) are parsed
as JSON text, and every other field is passed as its text (the schema converts ``"3"`` to 3 and
``"true"`` to true). The route then validates, limits and answers exactly as for JSON, so the two
forms share every check and error.

This runs inside the body cap (the raw upload is counted) and after authentication (an
unauthenticated upload is never parsed). The form parser (python-multipart, through
Starlette) spools large files to disk rather than memory.
"""

from __future__ import annotations

import base64
import enum
import json
import types
from collections.abc import Iterable
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import ErrorCode, error_response
from service.api.schemas import ImageInput
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


def field_kinds(model: type[BaseModel]) -> dict[str, FieldKind]:
    """How each field of a JSON request model is given as a form field."""
    return {name: _kind(info.annotation) for name, info in model.model_fields.items()}


class FormError(Exception):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message, self.field = message, field


async def form_body(form: FormData, kinds: dict[str, FieldKind]) -> dict[str, Any]:
    """The JSON body equivalent to ``form``. Unknown fields are passed on, so the schema answers
    a typo with its usual 422."""
    body: dict[str, Any] = {}
    for key in dict.fromkeys(form.keys()):
        values = form.getlist(key)
        kind = kinds.get(key, FieldKind.value)
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
        else:
            body[key] = texts[0]
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
            forms[route.path] = body
    return forms


def _documented_content(route: APIRoute) -> dict[str, Any]:
    return dict((route.openapi_extra or {}).get("requestBody", {}).get("content", {}))


class MultipartFormMiddleware:
    """Rewrites multipart requests to the paths of ``forms`` into their JSON bodies."""

    def __init__(self, app: ASGIApp, limits: Limits, forms: dict[str, type[BaseModel]]) -> None:
        self.app = app
        self.kinds = {path: field_kinds(model) for path, model in forms.items()}
        # Beyond these the parser stops at once; within them the route's own checks (413 with the
        # field) apply, as for JSON.
        self.max_files = limits.max_images + 2
        self.max_fields = limits.max_labels + limits.max_texts + 64

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kinds = self.kinds.get(scope.get("path", "")) if scope["type"] == "http" else None
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
        if kinds is None or scope.get("method") != "POST" or not content_type.startswith(_FORM_BYTES):
            await self.app(scope, receive, send)
            return
        try:
            async with Request(scope, receive).form(max_files=self.max_files, max_fields=self.max_fields) as form:
                body = json.dumps(await form_body(form, kinds)).encode()
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
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:  # the body was read; only a disconnect can follow
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

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
    schema = model.model_json_schema()
    properties: dict[str, Any] = {}
    for name, kind in field_kinds(model).items():
        described = schema["properties"].get(name, {})
        note = f"form: {kind.value}" + (f"; {described['description']}" if "description" in described else "")
        binary = {"type": "string", "format": "binary"}
        text = {"type": "string"}
        shapes: dict[FieldKind, dict[str, Any]] = {
            FieldKind.image: binary,
            FieldKind.images: {"type": "array", "items": binary},
            FieldKind.texts: {"type": "array", "items": text},
            FieldKind.json: text,
            FieldKind.value: text,
        }
        properties[name] = {**shapes[kind], "description": note}
    required = [n for n in schema.get("required", []) if n in properties]
    form_schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        form_schema["required"] = required
    return {"requestBody": {"content": {FORM: {"schema": form_schema}}}}
