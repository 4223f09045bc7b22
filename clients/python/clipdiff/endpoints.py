"""Request bodies and result parsing for each endpoint, shared by both clients.

Each function returns a :class:`Plan`: the calls to send (one, or several when the work is
larger than the server's limits, see :mod:`clipdiff.splitting`) and how to merge their answers
into one result. The sync and async clients differ only in how they wait, never in what they
send.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

from clipdiff.errors import ClipServiceError
from clipdiff.images import image_input
from clipdiff.models import (
    ClassifyResult,
    CollectionAdd,
    CollectionInfo,
    CollectionSearch,
    DenseResult,
    EmbedResult,
    ModelInfo,
    ModelsInfo,
    PairResult,
    RankResult,
    ServerLimits,
)
from clipdiff.splitting import body_bounds
from clipdiff.transport import Call

Comparative = Mapping[str, str] | tuple[str, str, str]
PairSpec = tuple[Any, Any, str]
R = TypeVar("R")
NO_LIMITS = ServerLimits()


@dataclass
class Plan(Generic[R]):
    """The calls one client method sends, in order, and how their answers become its result."""

    calls: list[Call]
    merge: Callable[[list[Any]], R]


def single(call: Call, parse: Callable[[Any], R]) -> Plan[R]:
    return Plan([call], lambda answers: parse(answers[0]))


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    # Unset options are left out so the server applies its own defaults.
    return {k: v for k, v in body.items() if v is not None}


def _texts(texts: Iterable[str], what: str) -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a list of strings, not a single string")
    return list(texts)


def _comparative(c: Comparative) -> dict[str, str]:
    if isinstance(c, Mapping):
        return {"a": c["a"], "b": c["b"], "text": c["text"]}
    a, b, text = c
    return {"a": a, "b": b, "text": text}


def _split(
    path: str,
    body: dict[str, Any],
    key: str,
    items: list[Any],
    max_items: int | None,
    limits: ServerLimits,
    params: Mapping[str, str] | None = None,
) -> list[Call]:
    """One call per chunk of ``items`` (under ``key``) that fits the server's limits."""
    return [
        Call("POST", path, {**body, key: items[a:b]}, dict(params or {}))
        for a, b in body_bounds(body, key, items, max_items, limits.max_body_bytes)
    ]


def _same_model(answers: list[Any]) -> str:
    """The version all parts were answered by; a hot swap between parts would mix versions."""
    models = list(dict.fromkeys(a.get("model") for a in answers))
    if len(models) > 1:
        raise ClipServiceError(
            None, "model_changed", f"the serving version changed between parts of a split request ({models}); retry"
        )
    return str(models[0])


def _concat(answers: list[Any], key: str) -> list[Any] | None:
    parts = [a.get(key) for a in answers]
    return None if all(p is None for p in parts) else [x for p in parts for x in (p or [])]


def _count(answers: list[Any], key: str) -> int | None:
    return sum(a.get(key) or 0 for a in answers) or None


def classify(
    images: Sequence[Any],
    labels: Iterable[str],
    *,
    templates: Iterable[str] | None = None,
    descriptions: Mapping[str, Sequence[str]] | None = None,
    comparative: bool = False,
    comparatives: Iterable[Comparative] | None = None,
    alpha: float | None = None,
    symmetric: bool | None = None,
    gate_margin: float | None = None,
    top_k: int | None = None,
    encoder: str | None = None,
    method: str | None = None,
    model: str | None = None,
    limits: ServerLimits = NO_LIMITS,
) -> Plan[ClassifyResult]:
    body = _drop_none(
        {
            "labels": _texts(labels, "labels"),
            "templates": None if templates is None else _texts(templates, "templates"),
            "descriptions": None if descriptions is None else {k: list(v) for k, v in descriptions.items()},
            "comparatives": None if comparatives is None else [_comparative(c) for c in comparatives],
            "alpha": alpha,
            "symmetric": symmetric,
            "gate_margin": gate_margin,
            "top_k": top_k,
            "encoder": encoder,
            "method": method,
            "model": model,
        }
    )
    params = {"comparative": "true"} if comparative else {}
    items = [image_input(x) for x in images]
    calls = _split("/classify", body, "images", items, limits.max_images, limits, params)

    def merge(answers: list[Any]) -> ClassifyResult:
        # Each image is classified on its own, so the parts' results simply follow each other.
        merged = {**answers[0], "model": _same_model(answers), "results": _concat(answers, "results")}
        gated = _concat([a.get("comparative") or {} for a in answers], "images_gated")
        if gated is not None:
            merged["comparative"] = {**merged["comparative"], "images_gated": gated}
        return ClassifyResult.model_validate(merged)

    return Plan(calls, merge)


def rank_pair(
    image_a: Any, image_b: Any, difference: str, *, encoder: str | None = None, model: str | None = None
) -> Plan[PairResult]:
    body = {"image_a": image_input(image_a), "image_b": image_input(image_b), "difference": difference}
    return single(Call("POST", "/rank-pair", _drop_none({**body, "encoder": encoder, "model": model})), parse_pair)


def rank_pairs(
    pairs: Iterable[PairSpec],
    *,
    encoder: str | None = None,
    model: str | None = None,
    limits: ServerLimits = NO_LIMITS,
) -> Plan[list[PairResult]]:
    items = [
        {"image_a": image_input(a), "image_b": image_input(b), "difference": difference} for a, b, difference in pairs
    ]
    body = _drop_none({"encoder": encoder, "model": model})
    calls = _split("/rank-pair", body, "pairs", items, limits.max_pairs, limits)

    def merge(answers: list[Any]) -> list[PairResult]:
        return parse_pairs({"model": _same_model(answers), "results": _concat(answers, "results")})

    return Plan(calls, merge)


def rank(
    images: Sequence[Any],
    difference: str,
    *,
    encoder: str | None = None,
    model: str | None = None,
    limits: ServerLimits = NO_LIMITS,
) -> Plan[RankResult]:
    body = _drop_none({"difference": difference, "encoder": encoder, "model": model})
    items = [image_input(x) for x in images]
    bounds = body_bounds(body, "images", items, limits.max_images, limits.max_body_bytes)
    # /rank needs two images: a last part of one repeats the image before it (dropped on merge).
    repeated = 1 if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1 else 0
    if repeated:
        bounds[-1] = (bounds[-1][0] - 1, bounds[-1][1])
    calls = [Call("POST", "/rank", {**body, "images": items[a:b]}) for a, b in bounds]

    def merge(answers: list[Any]) -> RankResult:
        if len(answers) == 1:
            return RankResult.model_validate(answers[0])
        # An image's score does not depend on the others in its request, so the parts' scores
        # are ordered as one request's would be: descending, ties in input order.
        parts = [a["scores"] for a in answers]
        parts[-1] = parts[-1][repeated:]
        scores: list[float] = [x for p in parts for x in p]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        ranking = [{"index": i, "score": scores[i]} for i in order]
        merged = {"model": _same_model(answers), "ranking": ranking, "scores": scores}
        truncated = _count(answers[:1], "truncated_texts")  # the same text in every part
        return RankResult.model_validate(_drop_none({**merged, "truncated_texts": truncated}))

    return Plan(calls, merge)


def score_dense(
    image: Any,
    texts: Iterable[str],
    *,
    return_maps: bool = False,
    model: str | None = None,
    limits: ServerLimits = NO_LIMITS,
) -> Plan[DenseResult]:
    body = _drop_none({"image": image_input(image), "return_maps": return_maps, "model": model})
    calls = _split("/score/dense", body, "texts", _texts(texts, "texts"), limits.max_texts, limits)

    def merge(answers: list[Any]) -> DenseResult:
        scores: list[float] = _concat(answers, "scores") or []
        merged = {
            "model": _same_model(answers),
            "scores": scores,
            "best": max(range(len(scores)), key=lambda i: (scores[i], -i)),  # the first on ties
            **{k: _concat(answers, k) for k in ("cosine", "maps", "tokens", "functional_words")},
            "truncated_texts": _count(answers, "truncated_texts"),
        }
        return DenseResult.model_validate(_drop_none(merged))

    return Plan(calls, merge)


def dense_heatmap(image: Any, text: str, *, model: str | None = None) -> Plan[bytes]:
    body = _drop_none({"image": image_input(image), "text": text, "model": model})
    return single(Call("POST", "/score/dense/heatmap", body, raw=True), bytes)


EncodingFormat = Literal["float", "base64", "float16"]


def embed_texts(
    texts: Iterable[str],
    *,
    encoder: str | None = None,
    model: str | None = None,
    as_numpy: bool = False,
    limits: ServerLimits = NO_LIMITS,
) -> Plan[EmbedResult]:
    body = _drop_none({"encoder": encoder, "model": model, "encoding_format": "base64" if as_numpy else None})
    calls = _split("/embed", body, "texts", _texts(texts, "texts"), limits.max_texts, limits)
    return Plan(calls, lambda answers: _merge_embed(answers, as_numpy))


def embed_images(
    images: Sequence[Any], *, model: str | None = None, as_numpy: bool = False, limits: ServerLimits = NO_LIMITS
) -> Plan[EmbedResult]:
    body = _drop_none({"model": model, "encoding_format": "base64" if as_numpy else None})
    items = [image_input(x) for x in images]
    calls = _split("/embed", body, "images", items, limits.max_images, limits)
    return Plan(calls, lambda answers: _merge_embed(answers, as_numpy))


def _merge_embed(answers: list[Any], as_numpy: bool) -> EmbedResult:
    merged = {
        "model": _same_model(answers),
        "dim": answers[0]["dim"],
        "ids": _concat(answers, "ids") or [],
        "truncated": _concat(answers, "truncated"),
    }
    rows: list[Any] = _concat(answers, "embeddings") or []
    embeddings = decode_float32(rows, int(merged["dim"])) if as_numpy else rows
    return EmbedResult.model_validate({**merged, "embeddings": embeddings})


def decode_float32(rows: list[str], dim: int) -> Any:
    """base64 rows of little-endian float32 (the server's ``encoding_format="base64"``) as an
    ``(N, dim)`` float32 numpy array."""
    try:
        import numpy as np
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("as_numpy=True needs numpy (pip install clipdiff-client[numpy])") from exc
    packed = b"".join(base64.b64decode(row) for row in rows)
    return np.frombuffer(packed, dtype="<f4").astype(np.float32).reshape(len(rows), dim)


def models() -> Plan[ModelsInfo]:
    return single(Call("GET", "/models"), parse_models)


def model_info(name: str) -> Plan[ModelInfo]:
    return single(Call("GET", f"/models/{quote(name, safe='')}"), parse_model)


def limits() -> Call:
    return Call("GET", "/limits")


# ----------------------------------------------------------------------------- collections
CollectionItem = tuple[str, Any] | tuple[str, Any, Mapping[str, Any]]


def _collection(name: str, *rest: str) -> str:
    return "/".join([f"/collections/{quote(name, safe='')}", *(quote(r, safe="") for r in rest)])


def create_collection(name: str, model: str | None, index: Mapping[str, Any] | None = None) -> Plan[CollectionInfo]:
    body = _drop_none({"model": model, "index": dict(index) if index is not None else None})
    return single(Call("PUT", _collection(name), body), CollectionInfo.model_validate)


def collections() -> Plan[list[CollectionInfo]]:
    return single(
        Call("GET", "/collections"), lambda data: [CollectionInfo.model_validate(c) for c in data["collections"]]
    )


def collection(name: str) -> Plan[CollectionInfo]:
    return single(Call("GET", _collection(name)), CollectionInfo.model_validate)


def drop_collection(name: str) -> Plan[None]:
    return single(Call("DELETE", _collection(name)), lambda _: None)


def reembed_collection(name: str) -> Plan[CollectionInfo]:
    return single(Call("POST", _collection(name, "reembed")), CollectionInfo.model_validate)


def import_to_collection(name: str, path: str) -> Plan[CollectionInfo]:
    return single(Call("POST", _collection(name, "imports"), {"path": path}), CollectionInfo.model_validate)


def add_to_collection(name: str, items: Iterable[CollectionItem]) -> Plan[CollectionAdd]:
    """``items``: ``(id, image)`` or ``(id, image, metadata)``; an image as ``image_input`` takes it."""
    body = [
        {"id": item[0], "image": image_input(item[1]), "metadata": dict(item[2]) if len(item) > 2 else {}}  # type: ignore[misc]
        for item in items
    ]
    return single(Call("POST", _collection(name, "images"), {"items": body}), CollectionAdd.model_validate)


def remove_from_collection(name: str, item_id: str) -> Plan[None]:
    return single(Call("DELETE", _collection(name, "images", item_id)), lambda _: None)


def search_collection(
    name: str,
    *,
    text: str | None,
    image: Any,
    difference: str | None,
    rerank: Literal["dense"] | None,
    k: int | None,
    filters: Mapping[str, Any] | None,
    limit: int,
    offset: int,
    encoder: str | None,
    ef_search: int | None = None,
) -> Plan[CollectionSearch]:
    body = _drop_none(
        {
            "text": text,
            "image": image_input(image) if image is not None else None,
            "difference": difference,
            "rerank": rerank,
            "k": k,
            "filters": dict(filters) if filters else None,
            "limit": limit,
            "offset": offset,
            "encoder": encoder,
            "ef_search": ef_search,
        }
    )
    return single(Call("POST", _collection(name, "search"), body), CollectionSearch.model_validate)


# ----------------------------------------------------------------------------- parsing
def parse_pair(data: Any) -> PairResult:
    return PairResult.model_validate(data)


def parse_pairs(data: Any) -> list[PairResult]:
    # The batch answer names the model once; each result carries it so results stand alone.
    model = data.get("model")
    return [PairResult.model_validate({"model": model, **item}) for item in data.get("results") or []]


def parse_models(data: Any) -> ModelsInfo:
    return ModelsInfo.model_validate(data)


def parse_model(data: Any) -> ModelInfo:
    return ModelInfo.model_validate(data)
