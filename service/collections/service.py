"""The collections of one server: the store, the image files, the threads their calls run on,
the background jobs, and the version of the model a new collection is bound to.

Store calls block (SQLite, FAISS), so they run on this module's own threads, never the event
loop; FAISS's OpenMP setting is per thread, so keeping them apart also keeps the model threads'
settings untouched.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from clipcore.errors import ClipError, ErrorCode, bad_input
from service.api.deps import Services
from service.collections.image_files import ImageFiles
from service.collections.jobs import JobBoard
from service.collections.store import CollectionInfo, CollectionStore, open_collections
from service.config import CollectionsSettings
from service.runtime.metrics import ServiceMetrics
from service.runtime.model_runtime import ModelRuntime
from service.runtime.served import Selection

T = TypeVar("T")


class Collections:
    def __init__(self, settings: CollectionsSettings, metrics: ServiceMetrics | None = None) -> None:
        self.settings = settings
        self.store: CollectionStore = open_collections(settings.url)
        self.images = ImageFiles(settings.image_path())
        self.jobs = JobBoard(metrics.collection_job_ended if metrics is not None else None)
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="collections")

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def close(self) -> None:
        await self.jobs.close()
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
