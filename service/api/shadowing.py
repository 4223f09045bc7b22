"""What a shadow comparison looks at in each endpoint's answer (``service.api.answering`` runs it).

``summarize`` says what is compared of each endpoint's answer: the top-1 label per image
(/classify), the decision per pair (/rank-pair), the top image (/rank), the best caption and the
scores (/score/dense), the embeddings (/embed, /v1/embeddings).
"""

from __future__ import annotations

from pydantic import BaseModel

from service.api.openai_schemas import EmbeddingsResponse
from service.api.schemas import ClassifyResponse, DenseResponse, EmbedResponse, RankPairResponse, RankResponse
from service.api.vector_encoding import decode_rows
from service.runtime.shadow import Answer

__all__ = ["summarize"]


def summarize(answer: BaseModel) -> Answer:
    """What a shadow comparison looks at in one endpoint's answer."""
    if isinstance(answer, ClassifyResponse):
        return Answer(decisions=tuple(r.label for r in answer.results))
    if isinstance(answer, RankPairResponse):
        pairs = answer.results if answer.results is not None else []
        return Answer(decisions=tuple(p.first for p in pairs) if pairs else (answer.first,))
    if isinstance(answer, RankResponse):
        return Answer(decisions=(answer.ranking[0].index,) if answer.ranking else ())
    if isinstance(answer, DenseResponse):
        return Answer(decisions=(answer.best,), scores=tuple(answer.scores))
    if isinstance(answer, EmbedResponse):
        return Answer(vectors=decode_rows(answer.embeddings, answer.encoding_format))
    if isinstance(answer, EmbeddingsResponse):
        rows = [item.embedding for item in answer.data]
        return Answer(vectors=decode_rows(rows, "base64" if rows and isinstance(rows[0], str) else "float"))
    raise TypeError(f"no shadow comparison for {type(answer).__name__}")
