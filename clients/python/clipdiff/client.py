"""The synchronous and asynchronous clients.

Both hold one ``httpx`` connection pool for their lifetime; use them as context managers (or
call ``close()``) so sockets are released. Endpoint bodies come from :mod:`clipdiff.endpoints`
and retries from :mod:`clipdiff.transport`, so the two classes only differ in awaiting.

Work larger than the server's limits is split into several requests and the answers merged in
order (:mod:`clipdiff.splitting`); the limits are read once per client from ``GET /limits``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx

from clipdiff import endpoints as ep
from clipdiff.errors import NotFound
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
    ServedModel,
    ServerLimits,
)
from clipdiff.transport import Call, RetryPolicy, send_async, send_sync

__all__ = ["AsyncClient", "Client"]

USER_AGENT = "clipdiff-client/0.1"
R = TypeVar("R")


URL_ENV = "CLIP_SERVICE_URL"
KEY_ENV = "CLIP_SERVICE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"


def _settings(
    base_url: str | None, api_key: str | None, timeout: float, headers: Mapping[str, str] | None
) -> dict[str, Any]:
    """httpx settings; an unset URL or key comes from ``CLIP_SERVICE_URL`` / ``CLIP_SERVICE_API_KEY``."""
    base_url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
    api_key = api_key if api_key is not None else os.environ.get(KEY_ENV)
    merged = {"user-agent": USER_AGENT, "accept": "application/json", **(headers or {})}
    if api_key:
        merged["authorization"] = f"Bearer {api_key}"
    # A short connect timeout makes a dead host fail fast (and be retried) while a slow
    # inference still gets the full read timeout.
    return {
        "base_url": base_url.rstrip("/"),
        "headers": merged,
        "timeout": httpx.Timeout(timeout, connect=min(timeout, 5.0)),
    }


class _Base:
    def __init__(self, max_retries: int, backoff: float, split: bool, model: str | None) -> None:
        self.retry = RetryPolicy(max_retries=max_retries, backoff=backoff)
        self.split = split
        self.default_model = model  # (``model`` is the method that describes one model)
        self._limits: ServerLimits | None = None if split else ep.NO_LIMITS

    def _model(self, model: str | None) -> str | None:
        """The model a call names: its own ``model=``, else the client's (None: the server's default)."""
        return model if model is not None else self.default_model

    @staticmethod
    def _parse_limits(answer: Any) -> ServerLimits:
        return ServerLimits.model_validate(answer)


class Client(_Base):
    """Blocking client: ``with Client("http://host:8000") as c: c.classify(...)``.

    Args:
        base_url: server root, e.g. ``"http://127.0.0.1:8000"``; default ``$CLIP_SERVICE_URL``, else
            ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer <key>`` when given; default ``$CLIP_SERVICE_API_KEY``.
        timeout: seconds per attempt (connect is capped at 5 s).
        max_retries: retries after the first attempt on 429, 503 and connection failures.
        backoff: base of the exponential backoff in seconds.
        headers: extra headers on every request.
        split: split work larger than the server's limits into several requests (default);
            ``False`` sends everything at once (the server answers 413 when it is too large).
        model: the served model every call asks for unless it names its own with ``model=``
            (``"name"``, ``"name@alias"`` or ``"name@version"``); default: the server's first model.
            :meth:`served_models` lists what a server serves.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30,
        max_retries: int = 3,
        backoff: float = 0.2,
        *,
        headers: Mapping[str, str] | None = None,
        split: bool = True,
        model: str | None = None,
    ) -> None:
        super().__init__(max_retries, backoff, split, model)
        self._http = httpx.Client(**_settings(base_url, api_key, timeout, headers))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> Any:
        return send_sync(self._http, call, self.retry)

    def _run(self, plan: ep.Plan[R]) -> R:
        return plan.merge([self._send(call) for call in plan.calls])

    def limits(self) -> ServerLimits:
        """What one request may hold on this server (``GET /limits``), read once and kept; a
        server without that endpoint has unknown limits (nothing is split)."""
        if self._limits is None:
            try:
                self._limits = self._parse_limits(self._send(ep.limits()))
            except NotFound:
                self._limits = ServerLimits()
        return self._limits

    # ------------------------------------------------------------------ scoring
    def classify(
        self,
        images: Sequence[Any],
        labels: Iterable[str],
        *,
        templates: Iterable[str] | None = None,
        descriptions: Mapping[str, Sequence[str]] | None = None,
        comparative: bool = False,
        comparatives: Iterable[ep.Comparative] | None = None,
        alpha: float | None = None,
        symmetric: bool | None = None,
        gate_margin: float | None = None,
        top_k: int | None = None,
        encoder: str | None = None,
        method: str | None = None,
        model: str | None = None,
    ) -> ClassifyResult:
        """Zero-shot classification of each image over ``labels``.

        ``comparative=True`` enables comparative prompting: with ``comparatives`` (dicts
        ``{"a", "b", "text"}`` or ``(a, b, text)`` tuples) from the request, otherwise from the
        model's stored library; ``gate_margin`` limits it to images whose standard top-1 minus
        top-2 probability is below the threshold. ``encoder`` picks a text-encoder variant
        (e.g. ``"semclip"``); ``method="yukino"`` scores labels (usually whole captions, with
        ``templates=["{}"]``) by YUKINO's pseudo-token matching.
        """
        call = ep.classify(
            images,
            labels,
            templates=templates,
            descriptions=descriptions,
            comparative=comparative,
            comparatives=comparatives,
            alpha=alpha,
            symmetric=symmetric,
            gate_margin=gate_margin,
            top_k=top_k,
            encoder=encoder,
            method=method,
            model=self._model(model),
            limits=self.limits(),
        )
        return self._run(call)

    def rank_pair(
        self, image_a: Any, image_b: Any, difference: str, *, encoder: str | None = None, model: str | None = None
    ) -> PairResult:
        return self._run(ep.rank_pair(image_a, image_b, difference, encoder=encoder, model=self._model(model)))

    def rank_pairs(
        self, pairs: Iterable[ep.PairSpec], *, encoder: str | None = None, model: str | None = None
    ) -> list[PairResult]:
        """Several ``(image_a, image_b, difference)`` pairs (one request, or several when they are
        more than the server takes at once), results in order."""
        return self._run(ep.rank_pairs(pairs, encoder=encoder, model=self._model(model), limits=self.limits()))

    def rank(
        self, images: Sequence[Any], difference: str, *, encoder: str | None = None, model: str | None = None
    ) -> RankResult:
        return self._run(ep.rank(images, difference, encoder=encoder, model=self._model(model), limits=self.limits()))

    def score_dense(
        self, image: Any, texts: Iterable[str], return_maps: bool = False, *, model: str | None = None
    ) -> DenseResult:
        return self._run(
            ep.score_dense(image, texts, return_maps=return_maps, model=self._model(model), limits=self.limits())
        )

    def dense_heatmap(self, image: Any, text: str, *, model: str | None = None) -> bytes:
        """The PNG of ``text``'s per-token maps over ``image`` (``POST /score/dense/heatmap``)."""
        return self._run(ep.dense_heatmap(image, text, model=self._model(model)))

    def embed_texts(
        self, texts: Iterable[str], encoder: str | None = None, *, model: str | None = None, as_numpy: bool = False
    ) -> EmbedResult:
        """Text embeddings in input order; ``as_numpy=True``: ``.embeddings`` is an ``(N, dim)``
        float32 array (sent as packed float32, needs numpy)."""
        plan = ep.embed_texts(texts, encoder=encoder, model=self._model(model), as_numpy=as_numpy, limits=self.limits())
        return self._run(plan)

    def embed_images(self, images: Sequence[Any], *, model: str | None = None, as_numpy: bool = False) -> EmbedResult:
        return self._run(ep.embed_images(images, model=self._model(model), as_numpy=as_numpy, limits=self.limits()))

    # ------------------------------------------------------------------ models / health
    def models(self) -> ModelsInfo:
        return self._run(ep.models())

    def served_models(self) -> list[ServedModel]:
        """The models this server serves (its set, the default first): what ``model=`` may name,
        what each answers with now and whether it is loaded."""
        return self.models().served

    def model(self, name: str) -> ModelInfo:
        return self._run(ep.model_info(name))

    # ------------------------------------------------------------------ collections
    def create_collection(
        self, name: str, *, model: str | None = None, index: Mapping[str, Any] | None = None
    ) -> CollectionInfo:
        """A new collection bound to the version ``model`` (the default model) serves now;
        ``index`` ``{"kind": "hnsw", "m": 32, ...}`` for approximate search (docs/api.md)."""
        return self._run(ep.create_collection(name, self._model(model), index))

    def collections(self) -> list[CollectionInfo]:
        return self._run(ep.collections())

    def collection(self, name: str) -> CollectionInfo:
        return self._run(ep.collection(name))

    def drop_collection(self, name: str) -> None:
        self._run(ep.drop_collection(name))

    def add_to_collection(self, name: str, items: Iterable[ep.CollectionItem]) -> CollectionAdd:
        """Add ``(id, image)`` or ``(id, image, metadata)`` items (an id already there is replaced)."""
        return self._run(ep.add_to_collection(name, items))

    def remove_from_collection(self, name: str, item_id: str) -> None:
        self._run(ep.remove_from_collection(name, item_id))

    def reembed_collection(self, name: str) -> CollectionInfo:
        """Start embedding the collection's images again with the version its model serves now;
        its ``job`` shows the progress (``collection(name).job``)."""
        return self._run(ep.reembed_collection(name))

    def import_to_collection(self, name: str, path: str) -> CollectionInfo:
        """Start adding the images of a server folder or JSONL manifest (under the server's
        ``collections.import_roots``); its ``job`` shows the progress."""
        return self._run(ep.import_to_collection(name, path))

    def search_collection(
        self,
        name: str,
        *,
        text: str | None = None,
        image: Any = None,
        difference: str | None = None,
        rerank: Literal["dense"] | None = None,
        k: int | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        encoder: str | None = None,
        ef_search: int | None = None,
    ) -> CollectionSearch:
        """By ``text``, by ``image``, or by ``image`` and a ``difference`` text; see docs/api.md."""
        plan = ep.search_collection(
            name, text=text, image=image, difference=difference, rerank=rerank, k=k, filters=filters,
            limit=limit, offset=offset, encoder=encoder, ef_search=ef_search,
        )  # fmt: skip
        return self._run(plan)

    def _probe(self, path: str) -> bool:
        # Probes answer a yes/no question, so they never retry and never raise.
        try:
            return self._http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def health(self) -> bool:
        """The process is alive (``/healthz`` answered 200)."""
        return self._probe("/healthz")

    def ready(self) -> bool:
        """A model is loaded and warm (``/readyz`` answered 200)."""
        return self._probe("/readyz")

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.25) -> None:
        """Block until :meth:`ready`; raise ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"service not ready after {timeout} s")
            time.sleep(interval)


class AsyncClient(_Base):
    """Non-blocking client with the same methods as :class:`Client`, as coroutines."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30,
        max_retries: int = 3,
        backoff: float = 0.2,
        *,
        headers: Mapping[str, str] | None = None,
        split: bool = True,
        model: str | None = None,
    ) -> None:
        super().__init__(max_retries, backoff, split, model)
        self._http = httpx.AsyncClient(**_settings(base_url, api_key, timeout, headers))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> Any:
        return await send_async(self._http, call, self.retry)

    async def _run(self, plan: ep.Plan[R]) -> R:
        return plan.merge([await self._send(call) for call in plan.calls])

    async def limits(self) -> ServerLimits:
        if self._limits is None:
            try:
                self._limits = self._parse_limits(await self._send(ep.limits()))
            except NotFound:
                self._limits = ServerLimits()
        return self._limits

    async def classify(
        self,
        images: Sequence[Any],
        labels: Iterable[str],
        *,
        templates: Iterable[str] | None = None,
        descriptions: Mapping[str, Sequence[str]] | None = None,
        comparative: bool = False,
        comparatives: Iterable[ep.Comparative] | None = None,
        alpha: float | None = None,
        symmetric: bool | None = None,
        gate_margin: float | None = None,
        top_k: int | None = None,
        encoder: str | None = None,
        method: str | None = None,
        model: str | None = None,
    ) -> ClassifyResult:
        call = ep.classify(
            images,
            labels,
            templates=templates,
            descriptions=descriptions,
            comparative=comparative,
            comparatives=comparatives,
            alpha=alpha,
            symmetric=symmetric,
            gate_margin=gate_margin,
            top_k=top_k,
            encoder=encoder,
            method=method,
            model=self._model(model),
            limits=await self.limits(),
        )
        return await self._run(call)

    async def rank_pair(
        self, image_a: Any, image_b: Any, difference: str, *, encoder: str | None = None, model: str | None = None
    ) -> PairResult:
        return await self._run(ep.rank_pair(image_a, image_b, difference, encoder=encoder, model=self._model(model)))

    async def rank_pairs(
        self, pairs: Iterable[ep.PairSpec], *, encoder: str | None = None, model: str | None = None
    ) -> list[PairResult]:
        return await self._run(
            ep.rank_pairs(pairs, encoder=encoder, model=self._model(model), limits=await self.limits())
        )

    async def rank(
        self, images: Sequence[Any], difference: str, *, encoder: str | None = None, model: str | None = None
    ) -> RankResult:
        return await self._run(
            ep.rank(images, difference, encoder=encoder, model=self._model(model), limits=await self.limits())
        )

    async def score_dense(
        self, image: Any, texts: Iterable[str], return_maps: bool = False, *, model: str | None = None
    ) -> DenseResult:
        plan = ep.score_dense(
            image, texts, return_maps=return_maps, model=self._model(model), limits=await self.limits()
        )
        return await self._run(plan)

    async def dense_heatmap(self, image: Any, text: str, *, model: str | None = None) -> bytes:
        return await self._run(ep.dense_heatmap(image, text, model=self._model(model)))

    async def embed_texts(
        self, texts: Iterable[str], encoder: str | None = None, *, model: str | None = None, as_numpy: bool = False
    ) -> EmbedResult:
        plan = ep.embed_texts(
            texts, encoder=encoder, model=self._model(model), as_numpy=as_numpy, limits=await self.limits()
        )
        return await self._run(plan)

    async def embed_images(
        self, images: Sequence[Any], *, model: str | None = None, as_numpy: bool = False
    ) -> EmbedResult:
        return await self._run(
            ep.embed_images(images, model=self._model(model), as_numpy=as_numpy, limits=await self.limits())
        )

    async def models(self) -> ModelsInfo:
        return await self._run(ep.models())

    async def served_models(self) -> list[ServedModel]:
        return (await self.models()).served

    async def model(self, name: str) -> ModelInfo:
        return await self._run(ep.model_info(name))

    # ------------------------------------------------------------------ collections
    async def create_collection(
        self, name: str, *, model: str | None = None, index: Mapping[str, Any] | None = None
    ) -> CollectionInfo:
        return await self._run(ep.create_collection(name, self._model(model), index))

    async def collections(self) -> list[CollectionInfo]:
        return await self._run(ep.collections())

    async def collection(self, name: str) -> CollectionInfo:
        return await self._run(ep.collection(name))

    async def drop_collection(self, name: str) -> None:
        await self._run(ep.drop_collection(name))

    async def add_to_collection(self, name: str, items: Iterable[ep.CollectionItem]) -> CollectionAdd:
        return await self._run(ep.add_to_collection(name, items))

    async def remove_from_collection(self, name: str, item_id: str) -> None:
        await self._run(ep.remove_from_collection(name, item_id))

    async def reembed_collection(self, name: str) -> CollectionInfo:
        return await self._run(ep.reembed_collection(name))

    async def import_to_collection(self, name: str, path: str) -> CollectionInfo:
        return await self._run(ep.import_to_collection(name, path))

    async def search_collection(
        self,
        name: str,
        *,
        text: str | None = None,
        image: Any = None,
        difference: str | None = None,
        rerank: Literal["dense"] | None = None,
        k: int | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        encoder: str | None = None,
        ef_search: int | None = None,
    ) -> CollectionSearch:
        plan = ep.search_collection(
            name, text=text, image=image, difference=difference, rerank=rerank, k=k, filters=filters,
            limit=limit, offset=offset, encoder=encoder, ef_search=ef_search,
        )  # fmt: skip
        return await self._run(plan)

    async def _probe(self, path: str) -> bool:
        try:
            return (await self._http.get(path)).status_code == 200
        except httpx.HTTPError:
            return False

    async def health(self) -> bool:
        return await self._probe("/healthz")

    async def ready(self) -> bool:
        return await self._probe("/readyz")

    async def wait_ready(self, timeout: float = 60.0, interval: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"service not ready after {timeout} s")
            await asyncio.sleep(interval)
