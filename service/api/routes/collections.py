"""/collections: create, list, inspect and drop collections; add, remove and search their images."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from clipcore.errors import ClipError, ErrorCode, bad_input, too_large
from service.api.deps import PipelineDep, ServicesDep
from service.api.multipart import openapi_form
from service.api.schemas import ERROR_RESPONSES, error_response_doc
from service.api.validation import check_count, check_text, is_unicode
from service.collections import operations
from service.collections.imports import ItemCheck, list_dataset, start_import
from service.collections.jobs import Job
from service.collections.schemas import (
    AddImagesForm,
    AddImagesRequest,
    AddImagesResponse,
    CollectionIndex,
    CollectionInfo,
    CollectionList,
    CreateCollectionRequest,
    ImportRequest,
    IndexSettings,
    JobInfo,
    RemovedResponse,
    SearchRequest,
    SearchResponse,
)
from service.collections.service import Collections, current_runtime, model_ref
from service.collections.store import METADATA_KEY_PATTERN, NAME_PATTERN, IndexSpec, Scalar
from service.collections.store import CollectionInfo as StoredInfo
from service.collections.versions import bound_runtime, check_version, start_reembed
from service.config import CollectionsSettings

router = APIRouter(
    tags=["collections"],
    responses={
        **ERROR_RESPONSES,
        409: error_response_doc(
            "collection_exists, or version_mismatch (the collection's model serves another version now: re-embed it)"
        ),
        503: error_response_doc(
            "not_ready: the model is not loaded, the collection is being re-embedded (or another of its jobs runs), "
            "or the collections folder cannot be written; retry after Retry-After seconds where it is sent",
            retry_after=True,
        ),
    },
)
_METADATA_KEY = re.compile(METADATA_KEY_PATTERN)
ADD_IMAGES = "/collections/{name}/images"
DEFAULT_CANDIDATES = 100  # a search's first-stage k when the request leaves it out


async def get_collections(request: Request) -> Collections:
    return request.app.state.collections  # type: ignore[no-any-return]


CollectionsDep = Annotated[Collections, Depends(get_collections)]
Name = Annotated[str, Path(pattern=NAME_PATTERN, description="the collection's name")]


def _shown(info: StoredInfo, job: Job | None = None) -> CollectionInfo:
    return CollectionInfo(
        job=None if job is None else JobInfo.model_validate(job, from_attributes=True),
        name=info.name,
        model=model_ref(info),
        entry=info.model,
        dim=info.dim,
        count=info.count,
        dense=info.dense,
        created_at=info.created_at,
        index=CollectionIndex(kind="exact")
        if info.index.kind == "exact"
        else CollectionIndex(
            kind=info.index.kind,
            m=info.index.m,
            ef_construction=info.index.ef_construction,
            ef_search=info.index.ef_search,
        ),
    )


def _index_spec(settings: IndexSettings | None) -> IndexSpec | None:
    """The store's index of a create request's ``index`` (its knobs left out: their defaults)."""
    if settings is None:
        return None
    knobs = {k: v for k, v in settings.model_dump(exclude={"kind"}).items() if v is not None}
    return IndexSpec(settings.kind, **knobs)


@router.put("/collections/{name}", response_model=CollectionInfo, status_code=201)
async def create_collection(
    name: Name, req: CreateCollectionRequest, services: ServicesDep, collections: CollectionsDep
) -> CollectionInfo:
    selection, runtime = current_runtime(services, req.model)
    dense = operations.stores_dense(runtime)
    info = await collections.call(
        collections.store.create,
        name,
        selection.entry.ref,
        runtime.bundle.version,
        runtime.bundle.embed_dim,
        dense,
        _index_spec(req.index),
    )
    return _shown(info)


@router.get("/collections", response_model=CollectionList)
async def list_collections(collections: CollectionsDep) -> CollectionList:
    infos = await collections.call(collections.store.list_all)
    return CollectionList(collections=[_shown(i, collections.jobs.jobs.get(i.name)) for i in infos])


@router.get("/collections/{name}", response_model=CollectionInfo)
async def get_collection(name: Name, collections: CollectionsDep) -> CollectionInfo:
    return _shown(await collections.call(collections.store.info, name), collections.jobs.jobs.get(name))


@router.delete("/collections/{name}", response_model=RemovedResponse)
async def drop_collection(name: Name, collections: CollectionsDep) -> RemovedResponse:
    await collections.call(collections.store.info, name)  # 404 before its job is touched
    await collections.jobs.cancel(name)
    await collections.call(collections.store.drop, name)
    await collections.call(collections.images.drop, name)
    return RemovedResponse(collection=name, removed=name)


@router.post(
    "/collections/{name}/reembed",
    response_model=CollectionInfo,
    status_code=202,
    response_model_exclude_none=True,
)
async def reembed(
    name: Name, services: ServicesDep, pipeline: PipelineDep, collections: CollectionsDep
) -> CollectionInfo:
    """Embeds every image of the collection again with the version its model serves now, in the
    background, into a new index that replaces the old one at once when complete; meanwhile the
    collection answers 503. Progress: `GET /collections/{name}` (`job`)."""
    info = await collections.call(collections.store.info, name)
    job = start_reembed(services, pipeline, collections, info)
    return _shown(info, job)


@router.post(ADD_IMAGES, response_model=AddImagesResponse, openapi_extra=openapi_form(AddImagesForm))
async def add_images(
    name: Name,
    req: AddImagesRequest,
    request: Request,
    services: ServicesDep,
    pipeline: PipelineDep,
    collections: CollectionsDep,
) -> AddImagesResponse:
    check_add(req, collections.settings)
    info = await collections.call(collections.store.info, name)
    async with bound_runtime(request, services, pipeline, collections, info) as runtime:
        return await operations.add_images(pipeline, runtime, collections, info, req)


@router.post(
    "/collections/{name}/imports", response_model=CollectionInfo, status_code=202, response_model_exclude_none=True
)
async def import_dataset(
    name: Name, req: ImportRequest, services: ServicesDep, pipeline: PipelineDep, collections: CollectionsDep
) -> CollectionInfo:
    """Adds the images of a server folder or JSONL manifest under `collections.import_roots` in
    the background (403 outside them); the listing and every id and metadata are checked first.
    Progress: `GET /collections/{name}` (`job`)."""
    info = await collections.call(collections.store.info, name)
    check_version(services, pipeline, collections, info)
    bounds = collections.settings
    items = await collections.call(
        list_dataset, req.path, bounds.import_roots, bounds.max_items_per_import, item_check(bounds)
    )
    return _shown(info, start_import(services, pipeline, collections, info, req.path, items))


@router.delete("/collections/{name}/images/{item_id}", response_model=RemovedResponse)
async def remove_image(name: Name, item_id: str, collections: CollectionsDep) -> RemovedResponse:
    collections.jobs.refuse_while_reembedding(name)  # its items are being copied to the new version
    if not await collections.call(collections.store.remove, name, item_id):
        raise ClipError(ErrorCode.not_found, f"collection {name!r} has no item {item_id[:200]!r}", "item_id")
    return RemovedResponse(collection=name, removed=item_id)


@router.post("/collections/{name}/search", response_model=SearchResponse, response_model_exclude_none=True)
async def search(
    name: Name,
    req: SearchRequest,
    request: Request,
    services: ServicesDep,
    pipeline: PipelineDep,
    collections: CollectionsDep,
) -> SearchResponse:
    check_search(req, collections.settings, services)
    info = await collections.call(collections.store.info, name)
    async with bound_runtime(request, services, pipeline, collections, info) as runtime:
        return await operations.search(pipeline, runtime, collections, info, req)


# ----------------------------------------------------------------------------- bounds
def check_add(req: AddImagesRequest, bounds: CollectionsSettings) -> None:
    check_count(req.items, "items", 1, bounds.max_items_per_add, "items")
    for i, item in enumerate(req.items):
        check_item(item.id, item.metadata, f"items.{i}", bounds)


def item_check(bounds: CollectionsSettings) -> ItemCheck:
    """``check_item`` under these bounds, as an import checks each item of its dataset."""

    def check(item_id: str, metadata: Mapping[str, Scalar], field: str) -> None:
        check_item(item_id, metadata, field, bounds)

    return check


def check_item(item_id: str, metadata: Mapping[str, Scalar], field: str, bounds: CollectionsSettings) -> None:
    if len(item_id) > bounds.max_id_chars:
        raise too_large(f"an id has at most {bounds.max_id_chars} characters", f"{field}.id")
    if not is_unicode(item_id):
        raise bad_input("an id must be Unicode text (it holds an unpaired surrogate)", f"{field}.id")
    check_metadata(metadata, f"{field}.metadata")
    if len(metadata) > bounds.max_metadata_keys:
        raise too_large(f"metadata has at most {bounds.max_metadata_keys} keys", f"{field}.metadata")
    size = len(json.dumps(metadata, separators=(",", ":")).encode())
    if size > bounds.max_metadata_bytes:
        raise too_large(
            f"metadata is {size} bytes as JSON, over {bounds.max_metadata_bytes} (collections.max_metadata_bytes)",
            f"{field}.metadata",
        )


def check_search(req: SearchRequest, bounds: CollectionsSettings, services: ServicesDep) -> None:
    limits = services.settings.limits
    for field in ("text", "difference"):
        value = getattr(req, field)
        if value is not None:
            check_text(value, field, limits)
    if req.offset + req.limit > bounds.max_results:
        raise too_large(f"offset + limit is at most {bounds.max_results} (collections.max_results)", "limit")
    if req.k is None:
        req.k = min(DEFAULT_CANDIDATES, bounds.max_results)
    elif req.k > bounds.max_results:
        raise too_large(f"k is at most {bounds.max_results} (collections.max_results)", "k")
    check_metadata(req.filters, "filters")


def check_metadata(values: Mapping[str, object], field: str) -> None:
    for key, value in values.items():
        if not _METADATA_KEY.match(key):
            raise bad_input(
                f"metadata keys are 1-64 letters, digits and '_', not starting with a digit; got {key[:80]!r}",
                f"{field}.{key[:80]}",
            )
        # A str inside a union takes JSON's lone-surrogate escapes, which cannot be answered as UTF-8.
        if isinstance(value, str) and not is_unicode(value):
            raise bad_input("a metadata value must be Unicode text (it holds an unpaired surrogate)", f"{field}.{key}")
