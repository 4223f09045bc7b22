"""The collections of one server: the store, the thread its calls run on, and the version check.

Store calls block (SQLite, FAISS), so they run on this module's own threads, never the event
loop; FAISS's OpenMP setting is per thread, so keeping them apart also keeps the model threads'
settings untouched.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from fastapi import Request

from clipcore.errors import ClipError, ErrorCode, bad_input
from service.api.answering import use_model
from service.api.deps import Services
from service.collections.store import CollectionInfo, CollectionStore, open_collections
from service.config import CollectionsSettings
from service.runtime.model_runtime import ModelRuntime
from service.runtime.served import Selection

T = TypeVar("T")


class Collections:
    def __init__(self, settings: CollectionsSettings) -> None:
        self.settings = settings
        self.store: CollectionStore = open_collections(settings.url)
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="collections")

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def close(self) -> None:
        await self.call(self.store.close)
        self._threads.shutdown(wait=False)


def model_ref(info: CollectionInfo) -> str:
    """``name@version`` of the embeddings a collection holds."""
    return f"{info.model.partition('@')[0]}@{info.version}"


def current_runtime(services: Services, model: str | None) -> tuple[Selection, ModelRuntime]:
    """The entry ``model`` names and the version it serves now (its primary), for a new collection."""
    selection = services.models.resolve(model)
    runtime = selection.entry.current
    if runtime is None:
        raise ClipError(ErrorCode.not_ready, selection.entry.not_ready_message(), retry_after=1)
    if selection.version is not None and selection.version != runtime.bundle.version:
        raise bad_input(
            f"a collection is bound to the version its model serves now ({runtime.ref}), not to "
            f"{selection.entry.name}@{selection.version} (a canary); name the model ({selection.entry.ref})",
            "model",
        )
    return selection, runtime


@contextlib.asynccontextmanager
async def bound_runtime(request: Request, services: Services, info: CollectionInfo) -> AsyncIterator[ModelRuntime]:
    """The runtime of the version the collection holds, held for the request; 409
    ``version_mismatch`` when its model serves another version now (never mixed)."""
    selection = services.models.resolve(info.model)
    current = selection.entry.current
    if current is not None and current.bundle.version != info.version:
        raise ClipError(
            ErrorCode.version_mismatch,
            f"collection {info.name!r} holds embeddings of {model_ref(info)}, but {info.model} now serves "
            f"{current.ref}; a collection never mixes versions: create a new collection on {info.model} and add "
            "its images again",
            "name",
        )
    # No await between the check above and the hold: a swap cannot come in between.
    async with use_model(request, services, Selection(selection.entry, info.version)) as runtime:
        yield runtime
