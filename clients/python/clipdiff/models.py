"""Typed results of the API calls.

Every model allows extra fields so that a newer server adding a field never breaks an older
client; field names are exactly those of the HTTP API.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

__all__ = [
    "ClassifyResult",
    "CollectionAdd",
    "CollectionHit",
    "CollectionInfo",
    "CollectionSearch",
    "ComparativeInfo",
    "DenseResult",
    "EmbedResult",
    "HitScores",
    "ImageClassification",
    "LabelScore",
    "ModelInfo",
    "ModelsInfo",
    "PairResult",
    "RankResult",
    "RankedImage",
    "ServedModel",
    "ServerLimits",
    "VersionInfo",
]

_FLOAT_ROWS = TypeAdapter(list[list[float]])


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class LabelScore(_Result):
    label: str
    probability: float
    cosine: float


class ImageClassification(_Result):
    """One image's answer: the top-1 ``label`` and the ``top_k`` list, most probable first."""

    label: str
    top_k: list[LabelScore]

    def score(self, label: str) -> LabelScore | None:
        """The entry of ``label`` among the returned top-k, if present."""
        return next((s for s in self.top_k if s.label == label), None)


class MeasuredEffect(_Result):
    """The version's comparatives library as its evaluation measured it on one dataset."""

    dataset: str
    classes: int
    same_labels: bool
    confused_classes: list[str] = Field(default_factory=list)
    seeds: int
    images_per_seed: int | None = None
    accuracy_standard: float
    accuracy_comparative: float
    change: float
    change_stderr: float
    confused_standard: float | None = None
    confused_comparative: float | None = None


class ComparativeInfo(_Result):
    applied: bool
    pairs: list[tuple[str, str]] = Field(default_factory=list)
    alpha: float | None = None
    source: str | None = None
    images_gated: list[bool] | None = None
    measured: list[MeasuredEffect] | None = None


class ClassifyResult(_Result):
    model: str
    method: str = "standard"
    comparative: ComparativeInfo | None = None
    results: list[ImageClassification]
    truncated_texts: int | None = None

    @property
    def labels(self) -> list[str]:
        """Top-1 label per image, in input order."""
        return [r.label for r in self.results]


class PairResult(_Result):
    """``first == "a"`` when image a is the "first" of the difference text (``score >= 0``)."""

    model: str | None = None
    first: Literal["a", "b"]
    score: float


class RankedImage(_Result):
    index: int
    score: float


class RankResult(_Result):
    model: str
    ranking: list[RankedImage] = Field(description="best first")
    scores: list[float] = Field(description="in input order")
    truncated_texts: int | None = None

    @property
    def order(self) -> list[int]:
        """Input indices, best first."""
        return [r.index for r in self.ranking]


class EmbedResult(_Result):
    model: str
    dim: int
    embeddings: Any = Field(
        description="one list of floats per input; an (N, dim) float32 numpy array when asked for with as_numpy=True"
    )
    ids: list[str] = Field(default_factory=list)
    truncated: list[bool] | None = None

    def as_numpy(self) -> Any:
        """The embeddings as an ``(N, dim)`` float32 numpy array (needs numpy installed)."""
        try:
            import numpy as np
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("as_numpy() needs numpy (pip install clipdiff-client[numpy])") from exc
        return np.asarray(self.embeddings, dtype=np.float32).reshape(len(self.embeddings), self.dim)

    @field_validator("embeddings")
    @classmethod
    def _rows_or_array(cls, value: Any) -> Any:
        # An array decoded from the packed float32 answer is kept as it is (numpy is optional, so
        # it is recognised by its dtype rather than its class); anything else must be float rows.
        return value if hasattr(value, "dtype") else _FLOAT_ROWS.validate_python(value)


class DenseResult(_Result):
    model: str
    scores: list[float]
    best: int
    cosine: list[float] = Field(default_factory=list)
    maps: list[list[list[float]]] | None = None
    tokens: list[list[str]] | None = None
    functional_words: list[list[str]] = Field(default_factory=list)
    truncated_texts: int | None = None


class VersionInfo(_Result):
    version: str
    created_at: str | None = None
    aliases: list[str] = Field(default_factory=list)
    serving: bool = False
    text_encoders: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    eval: dict[str, Any] | None = None


class ModelInfo(_Result):
    name: str
    aliases: dict[str, str] = Field(default_factory=dict)
    serving: str | None = None
    versions: list[VersionInfo] = Field(default_factory=list)


class ServedModel(_Result):
    """One model a server serves: ``ref`` as configured (what ``model=`` may name), the
    ``name@version`` it answers with now (None while not loaded) and its ``state`` (``ready``,
    ``loading``, ``failed``, ``unloaded``: held out of memory until a request names it, or
    ``quarantined``: its last load on request failed, and ``quarantine`` says why and until when
    calls naming it get 503 without a load), the ``name@version`` of a canary loaded beside it
    (``model=`` may name it too), and ``answers``: the ``name@version`` that answers this client's
    calls naming it (by the ``X-Canary-Key`` in ``headers``, else the API key; None while a canary
    splits the callers and the client sends neither)."""

    ref: str
    serving: str | None = None
    state: str = "ready"
    default: bool = False
    canary: str | None = None
    answers: str | None = None
    quarantine: dict[str, Any] | None = None  # version, reason, refused, failures, until (UTC ISO 8601)


class ModelsInfo(_Result):
    serving: str | None = None
    served: list[ServedModel] = Field(default_factory=list)
    models: list[ModelInfo] = Field(default_factory=list)


class ServerLimits(_Result):
    """What one request may hold (``GET /limits``); ``None`` where the server does not say."""

    max_body_bytes: int | None = None
    max_images: int | None = None
    max_texts: int | None = None
    max_labels: int | None = None
    max_pairs: int | None = None
    max_concurrent_requests: int | None = None  # requests one server process holds at once (then 429)


class CollectionJob(_Result):
    """A collection's background job: ``reembed`` (its images embedded again with the version its
    model serves now) or ``import`` (images added from a server folder); ``done`` of ``total``
    images, ``state`` running, done or failed (with the ``error``); ``runs_here`` false while
    another server sharing the collections database runs it (this one shows its progress)."""

    kind: str
    model: str
    state: str
    done: int
    total: int
    error: str | None = None
    runs_here: bool = True  # servers from before job leases do not send it: each ran its own jobs
    started_at: str
    finished_at: str | None = None


class CollectionInfo(_Result):
    """A collection: the ``name@version`` whose embeddings it holds (``model``), the served model
    it was created on (``entry``), its width, item count, whether it can re-rank by DCSM, and its
    last background job (``job``)."""

    name: str
    model: str
    entry: str
    dim: int
    count: int
    dense: bool
    created_at: str
    index: dict[str, Any] | None = None  # {"kind": "exact"} or the HNSW knobs it was created with
    job: CollectionJob | None = None


class CollectionAdd(_Result):
    model: str
    collection: str
    added: list[str]
    count: int


class HitScores(_Result):
    cosine: float
    difference: float | None = None
    dense: float | None = None


class CollectionHit(_Result):
    id: str
    metadata: dict[str, Any]
    stage: Literal["cosine", "difference", "dense"]
    scores: HitScores


class CollectionSearch(_Result):
    model: str
    collection: str
    candidates: int
    hits: list[CollectionHit]
