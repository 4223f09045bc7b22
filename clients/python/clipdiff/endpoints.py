"""Request bodies and result parsing for each endpoint, shared by both clients.

Keeping this out of the client classes means the sync and async clients differ only in how they
wait, never in what they send.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from clipdiff.images import image_input
from clipdiff.models import (
    ClassifyResult,
    DenseResult,
    EmbedResult,
    ModelInfo,
    ModelsInfo,
    PairResult,
    RankResult,
)
from clipdiff.transport import Call

Comparative = Mapping[str, str] | tuple[str, str, str]
PairSpec = tuple[Any, Any, str]


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
) -> Call:
    body = _drop_none(
        {
            "images": [image_input(x) for x in images],
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
    return Call("POST", "/classify", body, params)


def rank_pair(
    image_a: Any, image_b: Any, difference: str, *, encoder: str | None = None, model: str | None = None
) -> Call:
    body = {"image_a": image_input(image_a), "image_b": image_input(image_b), "difference": difference}
    return Call("POST", "/rank-pair", _drop_none({**body, "encoder": encoder, "model": model}))


def rank_pairs(pairs: Iterable[PairSpec], *, encoder: str | None = None, model: str | None = None) -> Call:
    items = [
        {"image_a": image_input(a), "image_b": image_input(b), "difference": difference} for a, b, difference in pairs
    ]
    return Call("POST", "/rank-pair", _drop_none({"pairs": items, "encoder": encoder, "model": model}))


def rank(images: Sequence[Any], difference: str, *, encoder: str | None = None, model: str | None = None) -> Call:
    body = {"images": [image_input(x) for x in images], "difference": difference}
    return Call("POST", "/rank", _drop_none({**body, "encoder": encoder, "model": model}))


def score_dense(image: Any, texts: Iterable[str], *, return_maps: bool = False, model: str | None = None) -> Call:
    body = {"image": image_input(image), "texts": _texts(texts, "texts"), "return_maps": return_maps}
    return Call("POST", "/score/dense", _drop_none({**body, "model": model}))


def embed_texts(texts: Iterable[str], *, encoder: str | None = None, model: str | None = None) -> Call:
    return Call("POST", "/embed", _drop_none({"texts": _texts(texts, "texts"), "encoder": encoder, "model": model}))


def embed_images(images: Sequence[Any], *, model: str | None = None) -> Call:
    return Call("POST", "/embed", _drop_none({"images": [image_input(x) for x in images], "model": model}))


def models() -> Call:
    return Call("GET", "/models")


def model_info(name: str) -> Call:
    return Call("GET", f"/models/{quote(name, safe='')}")


# ----------------------------------------------------------------------------- parsing
def parse_classify(data: Any) -> ClassifyResult:
    return ClassifyResult.model_validate(data)


def parse_pair(data: Any) -> PairResult:
    return PairResult.model_validate(data)


def parse_pairs(data: Any) -> list[PairResult]:
    # The batch answer names the model once; each result carries it so results stand alone.
    model = data.get("model")
    return [PairResult.model_validate({"model": model, **item}) for item in data.get("results") or []]


def parse_rank(data: Any) -> RankResult:
    return RankResult.model_validate(data)


def parse_dense(data: Any) -> DenseResult:
    return DenseResult.model_validate(data)


def parse_embed(data: Any) -> EmbedResult:
    return EmbedResult.model_validate(data)


def parse_models(data: Any) -> ModelsInfo:
    return ModelsInfo.model_validate(data)


def parse_model(data: Any) -> ModelInfo:
    return ModelInfo.model_validate(data)
