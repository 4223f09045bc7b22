"""Request and response bodies of the /collections endpoints."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field
from pydantic.config import JsonDict

from service.api.schemas import DrawnImageInput, ImageInput, IntegralFloat, Shape, Text, _min_items, _Request
from service.collections.store import METADATA_KEY_PATTERN, NAME_PATTERN

Scalar = str | int | float | bool
# Metadata keys: the schema states the pattern, the server answers 400 with the field otherwise.
_KEYS: JsonDict = {"propertyNames": {"pattern": METADATA_KEY_PATTERN}}
Stage = Literal["cosine", "difference", "dense"]


class ExactIndex(_Request):
    """Every vector compared: the default; it takes no knobs (the schema says so, so a client
    that sends HNSW knobs with it learns that from the contract, not from a 422)."""

    kind: Literal["exact"] = Field(description="`exact`: every vector compared (the default)")


class HnswIndex(_Request):
    """An approximate HNSW graph (embedded store only); the knobs' names and bounds are pgvector's."""

    kind: Literal["hnsw"] = Field(
        description="`hnsw`: an approximate HNSW graph, for large collections: a top-10 search at 1,000,000 items "
        "in well under a millisecond of CPU against about 30 ms exact, at a recall measured in docs/benchmarks.md",
    )
    m: Annotated[int, Field(ge=2, le=100), IntegralFloat] | None = Field(
        default=None, description="links a node keeps (2 m on the ground layer); left out, 32"
    )
    ef_construction: Annotated[int, Field(ge=4, le=1000), IntegralFloat] | None = Field(
        default=None, description="candidates weighed when an item is inserted; left out, 128"
    )
    ef_search: Annotated[int, Field(ge=1, le=1000), IntegralFloat] | None = Field(
        default=None,
        description="candidates a search keeps (raised to the page's offset + limit when smaller); a "
        "search request may set its own; left out, 100",
    )


# How the collection's first stage searches, told apart by ``kind``.
IndexSettings = Annotated[ExactIndex | HnswIndex, Field(discriminator="kind")]


class CreateCollectionRequest(_Request):
    model: str | None = Field(
        default=None,
        description="the served model (`default`, `default@production`, or the version it serves now, "
        "`default@v6`) whose current version embeds the collection; left out, the first model of the served set",
    )
    index: IndexSettings | None = Field(
        default=None,
        description='`{"kind": "hnsw", "m": 32, "ef_construction": 128, "ef_search": 100}` for approximate search; '
        "left out, exact (the embedded store) or what `collections.url` chose (PostgreSQL, which takes no "
        "`index` here)",
    )


class JobInfo(BaseModel):
    kind: Literal["reembed", "import"] = Field(
        description="`reembed`: every kept image embedded again with the version the model serves now, into a "
        "new index that replaces the old one at once when complete; `import`: images added from a server folder"
    )
    model: str = Field(description="`name@version` that embeds the job's images")
    state: Literal["running", "done", "failed"]
    done: int = Field(description="images embedded so far")
    total: int = Field(description="images the job embeds")
    error: str | None = Field(default=None, description="why it failed")
    runs_here: bool = Field(
        description="whether this server runs the job (holds its lease); false until it starts, and while "
        "another server sharing the collections database runs it: this one shows that server's recorded "
        "progress and takes the job up if that server dies"
    )
    started_at: str
    finished_at: str | None = None


class CollectionIndex(BaseModel):
    kind: Literal["exact", "hnsw"]
    m: int | None = Field(default=None, description="`hnsw`: links a node keeps")
    ef_construction: int | None = Field(default=None, description="`hnsw`: candidates weighed an insert")
    ef_search: int | None = Field(default=None, description="`hnsw`: candidates a search keeps unless it sets its own")


class CollectionInfo(BaseModel):
    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(description="`name@version` whose embeddings the collection holds")
    entry: str = Field(description="the served model it was created on, as configured (`default@production`)")
    dim: int
    count: int = Field(description="items it holds")
    dense: bool = Field(description='whether it keeps DCSM image features, so `rerank: "dense"` works')
    created_at: str
    index: CollectionIndex = Field(description="how its first stage searches")
    job: JobInfo | None = Field(
        default=None, description="its last background job (a re-embedding or an import) since the server started"
    )


class CollectionList(BaseModel):
    collections: list[CollectionInfo]


class KeptImageInput(DrawnImageInput):
    """An image a collection keeps, to embed it again for a new model version: ``data`` or ``url``.
    A ``sha256`` reference names features only; the add answers it 400 with the reason, the
    schema leaves it out."""


class CollectionItem(_Request):
    id: str = Field(min_length=1, description="the caller's id; adding an id again replaces that item")
    image: KeptImageInput
    metadata: dict[str, Scalar] = Field(
        default_factory=dict,
        description="flat JSON: keys of letters, digits and '_' (not starting with a digit), values strings, "
        "numbers or booleans",
        json_schema_extra=_KEYS,
    )


# One entry of a form add's ``items`` part, as the contract states it.
_FORM_ITEM: JsonDict = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "metadata": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}, **_KEYS},
    },
    "required": ["id"],
    "additionalProperties": False,
}


class AddImagesForm(_Request):
    """An add as a multipart form (``-F images=@a.png -F images=@b.png -F 'items=[{"id": "a"}, {"id": "b"}]'``):
    the image files, and the items' ids and metadata as one JSON part, one entry per file, in order."""

    images: list[ImageInput] = Field(
        description="the image files, in the order of `items`", json_schema_extra=_min_items(1, unique=False)
    )
    # Each entry is checked as an item of the JSON body it becomes (``from_form``).
    items: list[dict[str, Any]] = Field(
        description='`[{"id": "sku-1", "metadata": {"colour": "red"}}, ...]`: one per file, in order',
        json_schema_extra={**_min_items(1, unique=False), "items": _FORM_ITEM},
    )

    @staticmethod
    def from_form(body: dict[str, Any]) -> dict[str, Any]:
        """The JSON body of an add (``AddImagesRequest``) that this form's fields make."""
        from service.api.multipart import FormError

        images, items = body.pop("images", []), body.pop("items", None)
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise FormError('an add takes its ids and metadata as one JSON part: -F \'items=[{"id": "a"}]\'', "items")
        if len(items) != len(images):
            raise FormError(f"items has {len(items)} entries for {len(images)} image files: one per file", "items")
        return {**body, "items": [{**item, "image": image} for item, image in zip(items, images, strict=True)]}


class AddImagesRequest(_Request):
    items: list[CollectionItem] = Field(json_schema_extra=_min_items(1, unique=False))
    form_model: ClassVar[type[BaseModel]] = AddImagesForm  # what a multipart add sends (service.api.multipart)


class AddImagesResponse(BaseModel):
    model: str
    collection: str
    added: list[str] = Field(description="the ids added or replaced, in request order")
    count: int = Field(description="items the collection holds now")


class ImportRequest(_Request):
    path: str = Field(
        min_length=1,
        description="an absolute server path under one of `collections.import_roots`: a folder (every image file "
        "below it, its id the path relative to the folder, no metadata) or a JSONL manifest (one "
        '`{"path": "relative/to/the/manifest.png", "id": "...", "metadata": {...}}` a line; `id` left out: the path)',
    )


class RemovedResponse(BaseModel):
    collection: str
    removed: str


class SearchRequest(_Request):
    """By ``text``; by ``image``; or by ``image`` and a ``difference`` text ("like this one, but ...")."""

    shapes = (
        Shape(("text",), ("image", "difference")),
        Shape(("image",), ("text", "difference")),
        Shape(("image", "difference"), ("text",)),
    )
    shape_error = "search by 'text', by 'image', or by 'image' and 'difference'"

    text: Text | None = None
    image: ImageInput | None = None
    difference: Text | None = Field(
        default=None,
        description="how the wanted images differ from `image`: candidates are ranked by "
        "normalize(g(c) - g(image)) . f(difference) (PC-CLIP)",
    )
    encoder: str | None = Field(
        default=None,
        description="text encoder of `text` or `difference`; left out: the version's default for `text`, its "
        "`pcclip` encoder (when it has one) for `difference`",
    )
    rerank: Literal["dense"] | None = Field(
        default=None, description="`dense`: re-score the first stage's top `k` by DCSM (text searches only)"
    )
    k: Annotated[int, Field(ge=1), IntegralFloat] | None = Field(
        default=None,
        description="first-stage candidates that a difference or a rerank ranks; left out, 100 (or "
        "`collections.max_results` when smaller)",
    )
    filters: dict[str, Scalar] = Field(
        default_factory=dict, description="metadata keys that must equal these values", json_schema_extra=_KEYS
    )
    limit: Annotated[int, Field(ge=1), IntegralFloat] = 10
    offset: Annotated[int, Field(ge=0), IntegralFloat] = 0
    ef_search: Annotated[int, Field(ge=1, le=1000), IntegralFloat] | None = Field(
        default=None,
        description="candidates an HNSW index keeps for this search (more: higher recall, more CPU); left out, "
        "the collection's; an exact collection ignores it",
    )


class HitScores(BaseModel):
    cosine: float = Field(
        description="g(c) . query: the text's or the image's embedding; for a `rerank: \"dense\"` search by a "
        'negated text, normalize(f(shown) - f(absent)) of its two parts ("a red bag", "a strap" of '
        '"a red bag without a strap"; -f(absent) when it names nothing shown)'
    )
    difference: float | None = None
    dense: float | None = None


class SearchHit(BaseModel):
    id: str
    metadata: dict[str, Scalar]
    stage: Stage = Field(description="the stage whose score put the hit where it is")
    scores: HitScores


class SearchResponse(BaseModel):
    model: str
    collection: str
    candidates: int = Field(description="items the first stage handed on (after filters)")
    hits: list[SearchHit]
