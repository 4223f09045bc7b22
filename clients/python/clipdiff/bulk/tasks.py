"""What each bulk command sends for a batch of rows and the output columns it fills.

- ``embed``: per row ``image``; columns ``embedding`` (float32 list), ``image_sha256``.
- ``classify``: per row ``image``; for every row ``labels`` (required), ``comparative``,
  ``top_k``; columns ``label``, ``top_k_labels``, ``top_k_probabilities``.
- ``rank-pairs``: per row ``image_a``, ``image_b``, ``difference`` (else the ``difference`` given
  for every row); columns ``first`` (``a`` / ``b``), ``score``.
- ``score-dense``: per row ``image`` and ``texts`` (a list) and / or ``text`` / ``caption``, plus
  the ``texts`` given for every row; columns ``texts``, ``scores``, ``cosine``, ``best``.

Every output also has ``index`` (the row's position in the input), ``key``, ``model`` (the
``name@version`` that answered) and ``error`` (null, or why the row has no result).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from clipdiff.bulk.datasets import Row
from clipdiff.client import AsyncClient
from clipdiff.models import ServerLimits

__all__ = ["TASKS", "BulkOptions", "Task", "output_schema"]


class RowError(ValueError):
    """A row that cannot be sent (a missing input field): recorded, never sent."""


@dataclass(frozen=True)
class BulkOptions:
    """What applies to every row: ``labels`` (classify), ``texts`` (score-dense, added to each
    row's), ``difference`` (rank-pairs, for rows without one), and the request options."""

    labels: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    difference: str | None = None
    comparative: bool = False
    top_k: int | None = None
    encoder: str | None = None
    model: str | None = None

    def manifest(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def _image(row: Row, name: str = "image") -> Any:
    value = row.fields.get(name)
    if value is None:
        raise RowError(f"no {name} in this row")
    if isinstance(value, bytes):
        return {"data": base64.b64encode(value).decode("ascii")}
    return value


@dataclass(frozen=True)
class Task:
    """One bulk command: its columns, its batch size on a server and how it scores a batch."""

    name: str
    columns: list[pa.Field] = field(default_factory=list)

    def check(self, options: BulkOptions) -> None:
        """Raise ValueError when the options cannot make a request of this command."""

    def batch_size(self, limits: ServerLimits) -> int:
        return limits.max_images or 64

    def item(self, row: Row, options: BulkOptions) -> Any:
        """The request item of ``row`` (raises RowError when the row lacks an input)."""
        return _image(row)

    async def score(self, client: AsyncClient, items: Sequence[Any], options: BulkOptions) -> list[dict[str, Any]]:
        raise NotImplementedError


class Embed(Task):
    async def score(self, client: AsyncClient, items: Sequence[Any], options: BulkOptions) -> list[dict[str, Any]]:
        result = await client.embed_images(items, model=options.model, as_numpy=True)
        return [
            {"model": result.model, "embedding": result.embeddings[i], "image_sha256": result.ids[i]}
            for i in range(len(items))
        ]


class Classify(Task):
    def check(self, options: BulkOptions) -> None:
        if len(options.labels) < 2:
            raise ValueError("classify needs at least two labels (--labels a,b,...)")

    async def score(self, client: AsyncClient, items: Sequence[Any], options: BulkOptions) -> list[dict[str, Any]]:
        result = await client.classify(
            items,
            options.labels,
            comparative=options.comparative,
            top_k=options.top_k,
            encoder=options.encoder,
            model=options.model,
        )
        return [
            {
                "model": result.model,
                "label": r.label,
                "top_k_labels": [s.label for s in r.top_k],
                "top_k_probabilities": [s.probability for s in r.top_k],
            }
            for r in result.results
        ]


class RankPairs(Task):
    def batch_size(self, limits: ServerLimits) -> int:
        return limits.max_pairs or 64

    def item(self, row: Row, options: BulkOptions) -> Any:
        difference = row.fields.get("difference") or options.difference
        if not difference:
            raise RowError("no difference in this row and none given for all rows (--difference)")
        return (_image(row, "image_a"), _image(row, "image_b"), str(difference))

    async def score(self, client: AsyncClient, items: Sequence[Any], options: BulkOptions) -> list[dict[str, Any]]:
        results = await client.rank_pairs(items, encoder=options.encoder, model=options.model)
        return [{"model": r.model, "first": r.first, "score": r.score} for r in results]


class ScoreDense(Task):
    def batch_size(self, limits: ServerLimits) -> int:
        return 1  # one image per /score/dense request; concurrency keeps the server busy

    def item(self, row: Row, options: BulkOptions) -> Any:
        texts = row.fields.get("texts") or []
        if isinstance(texts, str):
            texts = [texts]
        own = [row.fields[k] for k in ("text", "caption") if isinstance(row.fields.get(k), str)]
        every = [*map(str, texts), *own, *options.texts]
        if not every:
            raise RowError("no texts in this row (texts, text or caption) and none given for all rows (--text)")
        return (_image(row), every)

    async def score(self, client: AsyncClient, items: Sequence[Any], options: BulkOptions) -> list[dict[str, Any]]:
        answers = []
        for image, texts in items:
            r = await client.score_dense(image, texts, model=options.model)
            answers.append({"model": r.model, "texts": texts, "scores": r.scores, "cosine": r.cosine, "best": r.best})
        return answers


_FLOATS = pa.list_(pa.float32())
TASKS: dict[str, Task] = {
    "embed": Embed("embed", [pa.field("embedding", _FLOATS), pa.field("image_sha256", pa.string())]),
    "classify": Classify(
        "classify",
        [
            pa.field("label", pa.string()),
            pa.field("top_k_labels", pa.list_(pa.string())),
            pa.field("top_k_probabilities", _FLOATS),
        ],
    ),
    "rank-pairs": RankPairs("rank-pairs", [pa.field("first", pa.string()), pa.field("score", pa.float32())]),
    "score-dense": ScoreDense(
        "score-dense",
        [
            pa.field("texts", pa.list_(pa.string())),
            pa.field("scores", _FLOATS),
            pa.field("cosine", _FLOATS),
            pa.field("best", pa.int32()),
        ],
    ),
}


def output_schema(task: Task) -> pa.Schema:
    head = [pa.field("index", pa.int64()), pa.field("key", pa.string()), pa.field("model", pa.string())]
    return pa.schema([*head, *task.columns, pa.field("error", pa.string())])
