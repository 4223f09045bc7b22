"""``/v1/embeddings``: OpenAI's request turned into this service's texts and images.

The vectors come from the same pipeline as ``/embed`` (cache -> batcher -> encoder), so both
routes answer the same vectors for the same input; this module only sorts the inputs into texts
and images, checks them against the same limits and shapes the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from clipcore.methods.common import truncate_dimensions
from service.api.errors import bad_input
from service.api.openai_schemas import (
    IMAGE_PREFIX,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    OpenAIModel,
    OpenAIModelList,
    Usage,
)
from service.api.operations import both
from service.api.validation import check_count, check_text
from service.api.vector_encoding import encode_rows
from service.config import Limits
from service.runtime.assembly import ModelRuntime
from service.runtime.pipeline import Pipeline
from service.runtime.served import EntryStatus

OWNER = "clip-difference-service"


@dataclass(frozen=True)
class DataImage:
    """An image given inline (the pipeline's ``ImageRef`` with only ``data`` set)."""

    data: str
    url: None = None
    sha256: None = None


@dataclass(frozen=True)
class SortedInput:
    texts: list[str]
    text_positions: list[int]
    images: list[DataImage]
    image_positions: list[int]

    @property
    def size(self) -> int:
        return len(self.texts) + len(self.images)


def sort_input(req: EmbeddingsRequest, limits: Limits) -> SortedInput:
    """Split ``input`` into texts and images (400 / 413 like ``/embed``), keeping positions."""
    items = [req.input] if isinstance(req.input, str) else list(req.input)
    check_count(items, "input", 1, limits.max_texts + limits.max_images, "inputs")
    if not all(isinstance(item, str) for item in items):
        raise bad_input("token ids are not accepted: send the texts themselves", "input")
    out = SortedInput([], [], [], [])
    for i, item in enumerate(items):
        assert isinstance(item, str)
        if item.startswith(IMAGE_PREFIX):
            out.images.append(DataImage(item))
            out.image_positions.append(i)
        else:
            check_text(item, f"input.{i}", limits)
            out.texts.append(item)
            out.text_positions.append(i)
    check_count(out.texts, "input", 0, limits.max_texts, "texts")
    check_count(out.images, "input", 0, limits.max_images, "images")
    return out


async def embeddings(
    pipeline: Pipeline, rt: ModelRuntime, req: EmbeddingsRequest, limits: Limits
) -> EmbeddingsResponse:
    sorted_input = sort_input(req, limits)
    dim = rt.bundle.embed_dim
    if req.dimensions is not None and req.dimensions > dim:
        raise bad_input(f"dimensions is {req.dimensions}; {rt.ref} has {dim}-dimensional embeddings", "dimensions")
    vectors = np.zeros((sorted_input.size, dim), dtype=np.float32)

    async def texts() -> int:
        if not sorted_input.texts:
            return 0
        emb = await pipeline.embed_texts(rt, sorted_input.texts, None)
        vectors[sorted_input.text_positions] = emb.vectors
        return await token_count(pipeline, rt, sorted_input.texts)

    async def images() -> None:
        if sorted_input.images:
            fields = [f"input.{i}" for i in sorted_input.image_positions]
            emb = await pipeline.embed_images(rt, sorted_input.images, fields)
            vectors[sorted_input.image_positions] = emb.vectors

    tokens, _ = await both(texts(), images())
    if req.dimensions is not None and req.dimensions < dim:
        vectors = truncate_dimensions(vectors, req.dimensions)
    rows: list[list[float]] | list[str] = encode_rows(vectors, req.encoding_format)
    return EmbeddingsResponse(
        data=[Embedding(index=i, embedding=row) for i, row in enumerate(rows)],  # type: ignore[arg-type]
        model=rt.ref,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
    )


async def token_count(pipeline: Pipeline, rt: ModelRuntime, texts: list[str]) -> int:
    """Tokens the texts were encoded with by the version's tokenizer (special tokens included,
    capped at the context), counted in the decode pool, off the event loop."""
    return await pipeline.offload(lambda: sum(rt.bundle.token_count(t) for t in texts))


def model_list(served: list[EntryStatus]) -> OpenAIModelList:
    """The names a request's ``model`` may use, entry by entry of the served set: a model name
    (the first entry of that name answers it; it follows hot swaps), the exact ``name@version``
    an entry serves (or its configured ref while it is not loaded) and that of its loaded canary.
    Each id is listed once, with the version that answers the caller ``served`` was read for
    (``answers``): a name's depends on the caller's key while a canary splits its callers."""
    out: dict[str, OpenAIModel] = {}
    for entry in served:
        created = _unix(entry.created_at) if entry.created_at else 0
        ids = [
            (entry.name, entry.serving, created, entry.answers),
            (entry.serving or entry.ref, entry.serving, created, entry.serving),
        ]
        if entry.canary is not None:
            canary_created = _unix(entry.canary_created_at) if entry.canary_created_at else 0
            ids.append((entry.canary, entry.canary, canary_created, entry.canary))
        for model_id, serving, since, answers in ids:
            if model_id not in out:
                out[model_id] = OpenAIModel(
                    id=model_id,
                    created=since,
                    owned_by=OWNER,
                    serving=serving,
                    state=entry.state,
                    answers=answers,
                    canary=entry.canary if model_id == entry.name else None,
                )
    return OpenAIModelList(data=list(out.values()))


def _unix(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
