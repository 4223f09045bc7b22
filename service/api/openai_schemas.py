"""Request/response models of the OpenAI-compatible routes (``/v1/embeddings``, ``/v1/models``).

Field names and shapes are OpenAI's, so its SDK and the libraries built on it (LangChain,
LlamaIndex) parse the answers unchanged. Errors keep this service's envelope
(``{"error": {"code", "message", "field"}}``): OpenAI's clients read ``error.message`` and
``error.code`` from it just the same.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from service.api.schemas import SERVED_STATE, TEXT_SCHEMA, IntegralFloat, ServedState

IMAGE_PREFIX = "data:image/"

INPUT = (
    "a string or a list of strings; a string that starts with `data:image/` is an image (a base64 data URI, "
    "`data:image/png;base64,...`), any other string a text. Texts and images may be mixed: CLIP puts both in one "
    "space. Not token-id arrays (OpenAI's API takes them; they are refused with a 400): ids of OpenAI's "
    "tokenizer mean nothing to this model, which tokenizes the texts itself"
)
# The model still reads token arrays, so that they are refused with the reason (400 bad_input in
# service.api.openai_embeddings) rather than as a mere type mismatch; the contract leaves them out.
Input = Annotated[
    str | list[str] | list[int] | list[list[int]],
    WithJsonSchema({"anyOf": [TEXT_SCHEMA, {"type": "array", "items": TEXT_SCHEMA, "minItems": 1}]}),
]


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # as service.api.schemas._Request

    model: str = Field(
        description="which served model answers: a name (`default`), a version (`default@v6`) or an alias "
        "(`default@production`) of the served set (GET /v1/models lists it); anything else is a 404 unknown_model",
        examples=["default"],
    )
    input: Input = Field(description=INPUT, examples=[["a red circle"]])
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="`base64`: each vector as base64 of its little-endian float32 bytes"
    )
    dimensions: Annotated[int, Field(ge=1), IntegralFloat] | None = Field(
        default=None,
        description="keep the first N components and L2-normalise again (Matryoshka-style shortening); larger "
        "than the model's width is a 400. This model was not trained for it: short vectors lose more than those "
        "of a Matryoshka-trained model",
    )
    user: str | None = Field(default=None, description="accepted for compatibility; not used")


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int = Field(description="BPE tokens of the texts, start and end tokens included; images count 0")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str = Field(description="the version that answered (`name@version`)")
    usage: Usage


class OpenAIModel(BaseModel):
    id: str = Field(description="a value `model` may take: a model name, or the `name@version` an entry serves")
    object: Literal["model"] = "model"
    created: int = Field(description="when the version it answers with was published, Unix seconds (0: not loaded)")
    owned_by: str
    serving: str | None = Field(
        default=None,
        description="this service's addition: the `name@version` it answers with (for a name: the primary version "
        "of its entry), null while not loaded",
    )
    state: ServedState = Field(default="ready", description="this service's addition: " + SERVED_STATE)
    answers: str | None = Field(
        default=None,
        description="this service's addition: the `name@version` that answers the caller of this request when it "
        "names this id, by its `X-Canary-Key` header, else its API key (send the same headers as your requests): "
        "a name's canary answers the callers routed to it, a `name@version` always that version. Null while not "
        "loaded, or while a canary splits the callers and this request carries neither key (such requests are "
        "routed at random)",
    )
    canary: str | None = Field(
        default=None,
        description="this service's addition, on a name: the `name@version` of the canary loaded beside its primary "
        "(it is listed as an id of its own too), null when none",
    )


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]
