"""Request/response models of the HTTP API (docs/design.md, section 2), one pair per endpoint.

Requests forbid unknown fields so a typo ("lables") is a 422, not a silently ignored option, and
take JSON's types as they are (strict: ``"3"`` is not a number, ``1`` not a boolean), so what the
schema refuses the server refuses too. Limits that depend on settings (how many images, labels,
texts) are checked by ``service.api.validation`` because a schema is fixed at import time.

The schema states every other condition a request must meet that JSON Schema can express, so
that a request valid by the contract is served unless a limit, the serving model (its encoders,
its width) or the content (image bytes, label names given elsewhere in the body) refuses it. Some
of those conditions are checked in ``service.api.validation`` (400 with the field, the
documented answer) rather than by the models; the schema says them all the same.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.config import JsonDict

from service.api.errors import ErrorCode

SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
# A 16 px PNG of a red circle: the contract's example image (clients and fuzzers get a valid one).
EXAMPLE_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAAS0lEQVR42mP8//8/AymAiYFEQLIGFkyhu/LycLbyw4cEbEBWjclF14ApjSnIhF81"
    "phTtQ4kCDZghiFWKCZcELkEm/NKYRjAOvsQHAFBRGxtkUgvpAAAAAElFTkSuQmCC"
)

# A text holds a character that is not whitespace. The class lists each character Python's
# str.isspace() calls whitespace rather than using \s, which ECMA-262 and Python read differently;
# the schema's pattern and the server's check (service.api.validation) are this one regex.
NON_BLANK_PATTERN = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
NON_BLANK = re.compile(NON_BLANK_PATTERN)
# A prompt template holds "{}" exactly once: text without "{}" on either side of it. "{" runs are
# allowed when something other than "}" follows them, or at the end.
_NO_SLOT = r"(?:[^{]|\{+[^{}])*\{*"
TEMPLATE_PATTERN = rf"^{_NO_SLOT}\{{\}}{_NO_SLOT}$"

# What ``service.images.decode_base64`` takes: base64 of at least one byte, padded as Python's
# strict decoder wants it (any "=" after whole quads), with whitespace anywhere (MIME wraps lines),
# alone or after a data: URI head that says ;base64. Whitespace is spelled out as above.
_WS = r"[\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*"
_B64 = rf"[A-Za-z0-9+/]{_WS}"
_DATA_URI_HEAD = r"data:(?:[A-Za-z0-9_.+-]+/[A-Za-z0-9_.+-]+)?(?:;[^;,]*)*;base64[^;,]*(?:;[^;,]*)*,"
BASE64_PATTERN = (
    rf"^(?:{_DATA_URI_HEAD})?{_WS}(?:(?:{_B64}){{4}})*"
    rf"(?:(?:{_B64}){{4}}(?:={_WS})*|(?:{_B64}){{2}}={_WS}={_WS}|(?:{_B64}){{3}}={_WS})$"
)

TEXT_SCHEMA: JsonDict = {"type": "string", "minLength": 1, "pattern": NON_BLANK_PATTERN}
# A string in the schema that must not be blank; the server answers 400 with the field otherwise.
Text = Annotated[str, WithJsonSchema(TEXT_SCHEMA)]
Template = Annotated[str, WithJsonSchema({"type": "string", "pattern": TEMPLATE_PATTERN})]


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# JSON Schema's integer: 3.0 is one as well (a JSON number with no fraction), and strict int
# alone would refuse it; true is still no integer. Bounds go before the validator
# (Annotated[int, Field(ge=1), IntegralFloat]) or pydantic's schema spells them "ge", not "minimum".
IntegralFloat = BeforeValidator(_integral)
Integer = Annotated[int, IntegralFloat]


@dataclass(frozen=True)
class Shape:
    """One way of filling a request whose fields depend on each other: ``given`` are set (not
    null), ``absent`` are left out or null. A request takes exactly one of its model's shapes."""

    given: tuple[str, ...]
    absent: tuple[str, ...] = ()

    def fits(self, values: Mapping[str, Any]) -> bool:
        return all(values.get(f) is not None for f in self.given) and all(values.get(f) is None for f in self.absent)

    def json_schema(self, fields: Mapping[str, Any]) -> JsonDict:
        """This shape in a JSON body (null is the same as left out), given the model's schema of
        each field: a given field takes its types other than null."""
        properties: JsonDict = {f: {"type": _non_null_type(fields[f])} for f in self.given}
        properties.update({f: {"type": "null"} for f in self.absent})
        return {"required": list(self.given), "properties": properties}

    def form_schema(self) -> JsonDict:
        """This shape in a form, which has no null: an absent field is not sent at all."""
        return {"required": list(self.given), "properties": dict.fromkeys(self.absent, False)}


def _non_null_type(field: Mapping[str, Any]) -> str | list[Any]:
    # Spelled as types rather than {"not": {"type": "null"}}: schema tools handle "not" poorly
    # (schemathesis fails on it in a form that holds files).
    options = field.get("anyOf", [field])
    types = [o.get("type", "object" if "$ref" in o else None) for o in options if o.get("type") != "null"]
    if None in types or not types:
        raise TypeError(f"cannot state a non-null type for {field}")
    return types[0] if len(types) == 1 else types


def _shapes_schema(schema: JsonDict, cls: type[Any]) -> None:
    shapes = cls.documented_shapes()
    if shapes:
        fields = schema["properties"]
        assert isinstance(fields, dict)
        schema["oneOf"] = [shape.json_schema(fields) for shape in shapes]


MODEL_CHOICE = (
    "which served model answers: a name (`default`), a version (`default@v6`) or an alias (`default@production`) "
    "of the served set (GET /models lists it in `served`); left out, the first model of the set. Anything else "
    "is a 404 unknown_model"
)


class _Request(BaseModel):
    # strict: JSON's types as they are, as the schema states them ("3" is no integer, 1 no
    # boolean); forms convert their texts to those types first (service.api.multipart).
    # allow_inf_nan=False: Python's JSON parser reads NaN, Infinity and out-of-range literals
    # (1e999) as floats, and a form's "inf" converts to one; no field means anything by them, so
    # they are a 422 naming the field rather than a fault deep in the scoring code.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, json_schema_extra=_shapes_schema)

    # Set where fields depend on each other; the schema states them as a oneOf, the validator
    # below enforces them (422 with shape_error), from this one list.
    shapes: ClassVar[tuple[Shape, ...]] = ()
    shape_error: ClassVar[str] = ""

    @classmethod
    def documented_shapes(cls) -> tuple[Shape, ...]:
        return cls.shapes

    @model_validator(mode="after")
    def _one_shape(self) -> _Request:
        if self.shapes and sum(shape.fits(self.__dict__) for shape in self.shapes) != 1:
            raise ValueError(self.shape_error)
        return self


def _min_items(n: int, *, unique: bool = False) -> JsonDict:
    """The contract's lower bound of a list (and that its items differ); the server checks it
    (400 with the field) in ``service.api.validation``, where the upper bounds (from settings) are
    checked too."""
    return {"minItems": n, "uniqueItems": True} if unique else {"minItems": n}


class ErrorDetail(BaseModel):
    code: ErrorCode = Field(description="one of a closed set; branch on it, not on the message")
    message: str = Field(description="human-readable; its wording may change")
    field: str | None = Field(default=None, description="dotted path of the offending input, if one")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ImageInput(_Request):
    """Exactly one of ``data`` (base64 or a ``data:`` URI), ``url`` or ``sha256``."""

    shapes = (
        Shape(("data",), ("url", "sha256")),
        Shape(("url",), ("data", "sha256")),
        Shape(("sha256",), ("data", "url")),
    )
    shape_error = "an image needs exactly one of 'data', 'url' or 'sha256'"

    data: Annotated[str, WithJsonSchema({"type": "string", "minLength": 1, "pattern": BASE64_PATTERN})] | None = Field(
        default=None, description="base64 image bytes or a data: URI", examples=[EXAMPLE_PNG]
    )
    url: Annotated[str, WithJsonSchema({"type": "string", "minLength": 1})] | None = Field(
        default=None, description="http(s) URL; only when the server allows URLs"
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="hex digest of image bytes this model version already embedded",
    )


class DrawnImageInput(ImageInput):
    """An image the server draws (the heatmap): ``data`` or ``url``. A ``sha256`` reference names
    features only; the route answers it 400 with the reason, the schema leaves it out."""

    @classmethod
    def documented_shapes(cls) -> tuple[Shape, ...]:
        return tuple(shape for shape in cls.shapes if "sha256" not in shape.given)


class ComparativeInput(_Request):
    a: str = Field(description="the class the text describes first")
    b: str = Field(description="the class it is contrasted with (the one whose prompts are corrected)")
    text: Text = Field(description='"a ..., while b ..."')


# ----------------------------------------------------------------------------- classify
class ClassifyRequest(_Request):
    images: list[ImageInput] = Field(json_schema_extra=_min_items(1))
    labels: list[Text] = Field(
        json_schema_extra=_min_items(2, unique=True), examples=[["red circle", "blue square", "green cross"]]
    )
    templates: list[Template] | None = Field(default=None, description="each with exactly one {}",
                                             json_schema_extra=_min_items(1))  # fmt: skip
    descriptions: dict[str, list[Text]] | None = None
    comparatives: list[ComparativeInput] | None = Field(default=None, json_schema_extra=_min_items(1))
    alpha: float = Field(default=0.9, ge=0.0, le=1.0)
    symmetric: bool = False
    gate_margin: float | None = Field(default=None, ge=0.0)
    top_k: Integer = Field(default=5, ge=1)
    encoder: str | None = None
    method: Literal["standard", "yukino"] = Field(
        default="standard",
        description="`standard`: cosine of image and class embeddings. `yukino`: the image is inverted into a "
        "pseudo-token and each label scored by `cos(f('a photo of $'), f_c) - cos(f('a photo of no $'), f_c)` "
        "with the YUKINO component's text encoder (labels are usually whole captions, templates ['{}']); "
        "not combinable with comparative=true",
    )
    model: str | None = Field(default=None, description=MODEL_CHOICE)


class LabelScore(BaseModel):
    label: str
    probability: float
    cosine: float = Field(description="standard: cosine of image and class; yukino: the yes-minus-no score")


class ClassifyResult(BaseModel):
    label: str
    top_k: list[LabelScore]


class MeasuredEffect(BaseModel):
    """What the version's evaluation measured of its comparatives library on one dataset."""

    dataset: str = Field(description="the dataset's name in the version's eval.json (`clip-train evaluate --data`)")
    classes: int = Field(description="how many labels the dataset has")
    same_labels: bool = Field(description="whether this request's labels are exactly the dataset's labels")
    confused_classes: list[str] = Field(description="the dataset's labels the library's comparatives name")
    seeds: int
    images_per_seed: int | None = None
    accuracy_standard: float = Field(description="zero-shot accuracy with standard prompts")
    accuracy_comparative: float = Field(description="the same photos with the library's comparatives (alpha 0.9)")
    change: float = Field(description="accuracy_comparative minus accuracy_standard (mean of the per-seed change)")
    change_stderr: float = Field(description="standard error of the change over the seeds")
    confused_standard: float | None = Field(default=None, description="accuracy on the confused classes")
    confused_comparative: float | None = None


class ComparativeInfo(BaseModel):
    applied: bool
    pairs: list[tuple[str, str]] = Field(
        description="the (a, b) label pairs of the comparatives applied, each listed once however many texts it "
        "has, in the order first given; a pair with texts in both orders is listed in both"
    )
    alpha: float
    source: Literal["request", "library", "none"]
    images_gated: list[bool] | None = Field(
        default=None, description="with gate_margin: per image, whether the comparative prompts were used"
    )
    measured: list[MeasuredEffect] | None = Field(
        default=None,
        description="with source `library`: the effect of the version's comparatives as its own evaluation "
        "(eval.json) measured it on each dataset, at the request defaults (alpha 0.9, one-sided, no gate); "
        "left out when the version has no such evaluation. A change within twice its standard error is noise.",
    )


class ClassifyResponse(BaseModel):
    model: str
    method: Literal["standard", "yukino"] = "standard"
    comparative: ComparativeInfo
    results: list[ClassifyResult]
    truncated_texts: int | None = None


# ----------------------------------------------------------------------------- rank
class PairInput(_Request):
    image_a: ImageInput
    image_b: ImageInput
    difference: Text


class RankPairRequest(_Request):
    """Either one pair (``image_a``, ``image_b``, ``difference``) or ``pairs``, not both."""

    shapes = (
        Shape(("image_a", "image_b", "difference"), ("pairs",)),
        Shape(("pairs",), ("image_a", "image_b", "difference")),
    )
    shape_error = "give either 'image_a', 'image_b' and 'difference', or a 'pairs' list (not both)"

    image_a: ImageInput | None = None
    image_b: ImageInput | None = None
    difference: Text | None = None
    pairs: list[PairInput] | None = Field(default=None, json_schema_extra=_min_items(1))
    encoder: str | None = None
    model: str | None = Field(default=None, description=MODEL_CHOICE)


class PairResult(BaseModel):
    first: Literal["a", "b"]
    score: float


TRUNCATED_TEXTS = "only when some texts were longer than the model context: how many were truncated"


class RankPairResponse(BaseModel):
    model: str
    first: Literal["a", "b"] | None = None
    score: float | None = None
    results: list[PairResult] | None = None
    truncated_texts: int | None = Field(default=None, description=TRUNCATED_TEXTS)


class RankRequest(_Request):
    images: list[ImageInput] = Field(json_schema_extra=_min_items(2))
    difference: Text
    encoder: str | None = None
    model: str | None = Field(default=None, description=MODEL_CHOICE)


class RankedImage(BaseModel):
    index: int
    score: float


class RankResponse(BaseModel):
    model: str
    ranking: list[RankedImage] = Field(description="best first (most like the 'first' side of the text)")
    scores: list[float] = Field(description="in input order")
    truncated_texts: int | None = Field(default=None, description=TRUNCATED_TEXTS)


# ----------------------------------------------------------------------------- dense (DCSM)
class DenseRequest(_Request):
    image: ImageInput
    texts: list[Text] = Field(
        description="1 to max_texts candidate texts, each scored against the image", json_schema_extra=_min_items(1)
    )
    return_maps: bool = Field(default=False, description="also return the z-scored token x patch maps")
    model: str | None = Field(default=None, description=MODEL_CHOICE)


class DenseResponse(BaseModel):
    model: str
    scores: list[float] = Field(
        description="DCSM score of the image with each text, in input order; higher is a "
        "better match. Compare scores of one model version only"
    )
    best: int = Field(description="index of the highest score (the first one on ties)")
    cosine: list[float] = Field(description="plain pooled cosine of the image and each text (default text encoder)")
    maps: list[list[list[float]]] | None = Field(
        default=None,
        description="with return_maps, per text: the map the scorer read, one row per text position from the "
        "start token to the end token (at most L), one column per image token: the class token first, then "
        "the patches of the grid row by row from the top left. Rows are z-scored over the ordinary "
        "positions; rows of functional words hold the scorer's fixed row for the word's group",
    )
    tokens: list[list[str]] | None = Field(
        default=None, description="with return_maps, per text: the token text of each map row ('<start>', ...)"
    )
    functional_words: list[list[str]] = Field(description="per text, the functional words found, in order")
    truncated_texts: int | None = Field(
        default=None,
        description="only when some texts had more tokens than the scorer's L positions (or the "
        "model context): how many were truncated",
    )


class HeatmapRequest(_Request):
    image: DrawnImageInput = Field(description="given as data or url: the picture is drawn into the heatmap")
    text: Text
    model: str | None = Field(default=None, description=MODEL_CHOICE)


# ----------------------------------------------------------------------------- embed
ENCODING_FORMAT = (
    "`float`: JSON numbers. `base64`: each vector as base64 of its little-endian float32 bytes (OpenAI's "
    "format). `float16`: base64 of little-endian float16 bytes (half the size; served embeddings are "
    "float16-rounded already, so nothing is lost)"
)


class EmbedRequest(_Request):
    shapes = (Shape(("texts",), ("images",)), Shape(("images",), ("texts", "encoder")))
    shape_error = "give exactly one of 'texts' or 'images' ('encoder' selects a text encoder: not with images)"

    texts: list[Text] | None = Field(default=None, json_schema_extra=_min_items(1))
    images: list[ImageInput] | None = Field(default=None, json_schema_extra=_min_items(1))
    encoder: str | None = None
    model: str | None = Field(default=None, description=MODEL_CHOICE)
    encoding_format: Literal["float", "base64", "float16"] = Field(default="float", description=ENCODING_FORMAT)


class EmbedResponse(BaseModel):
    model: str
    dim: int
    encoding_format: Literal["float", "base64", "float16"] = "float"
    embeddings: list[list[float]] | list[str] = Field(description="in input order; strings unless 'float'")
    ids: list[str] = Field(description="sha256 hex of each text (UTF-8) or image's bytes")
    truncated: list[bool] | None = Field(default=None, description="texts only: cut to the model context")


# ----------------------------------------------------------------------------- models / health
class RetimeInfo(BaseModel):
    """Where the background re-timing of the serving primary's ``auto`` decision stands."""

    mode: Literal["time", "shared"] = Field(
        description="time: the decision was deferred, its candidates are timed again while the server is idle (or "
        "paced under the traffic after `auto_retime_busy_after_s`); "
        "shared: it was decided here, each attempt looks for a decision `clip-train tune` shared since"
    )
    state: Literal["waiting", "timing", "decided", "exhausted", "budget spent"] = Field(
        description="waiting (for the back-off and an idle spell), timing (an attempt runs), decided (a winner was "
        "swapped in: the `outcome` above), exhausted (every attempt ran without a decision), budget spent "
        "(`auto_retime_cpu_s` used up)"
    )
    attempts: int = Field(description="attempts that ran to the end (interrupted ones are not counted)")
    max_attempts: int = Field(description="the `auto_retime_attempts` setting")
    interrupted: int = Field(description="attempts stopped because a request arrived (or, under traffic, a load)")
    paced: int = Field(
        default=0,
        description="attempts that ran under the traffic, paced to `auto_retime_busy_share` of a core, because no "
        "idle spell came within `auto_retime_busy_after_s`",
    )
    cpu_s: float = Field(description="CPU seconds re-timing used for this version, interrupted attempts included")
    last: str | None = Field(
        default=None,
        description="what the last attempt came to: chosen, remembered, shared, deferred, unshared, interrupted, "
        "failed, superseded",
    )
    at: float | None = Field(default=None, description="when the last attempt ended (Unix time)")


class AutoInfo(BaseModel):
    """How ``precision=auto`` / ``backend=auto`` picked the serving version's backend."""

    outcome: Literal["chosen", "remembered", "deferred", "shared"] = Field(
        description="chosen: measured at this load and kept; remembered: read from the kept decision; deferred: the "
        "measurement's noise could not settle whether any candidate beats the reference, the reference serves, "
        "measured again in the background (`retime`) or at the next load; shared: "
        "read from the model store, where `clip-train tune` measured it for this CPU kind (nothing timed here)"
    )
    decision: str = Field(
        default="local",
        description="`shared (tuned on <machine> at <UTC time>)` for a decision read from the store, else `local`",
    )
    backend: str
    precision: str
    margin: float | None = Field(
        default=None,
        description="speed over the reference, median of the per-round ratios (deferred: the one in doubt)",
    )
    spread: float | None = Field(default=None, description="interquartile range / median of those ratios: the noise")
    rounds: int = Field(description="interleaved timing rounds")
    seconds: float = Field(description="time the rounds took")
    reason: str | None = Field(
        default=None,
        description="deferred: why the rounds could not tell whether any candidate beats the reference; chosen with a "
        "`tie`: which leaders tied and why this one serves",
    )
    at: float = Field(description="when it was decided (Unix time)")
    tuned_on: str | None = Field(default=None, description="shared: the machine `clip-train tune` measured on")
    tie: list[str] | None = Field(
        default=None,
        description="the leaders the rounds could not rank (each clearly faster than the reference, within each "
        "other's noise; `backend precision`), when there were several: one serves, the least memory first, then "
        "the fewest moving parts",
    )
    retime: RetimeInfo | None = Field(
        default=None,
        description="the serving primary only: its re-timing in the background (`auto_retime_attempts`; "
        "absent when off, or for a shared decision)",
    )


class VersionInfo(BaseModel):
    version: str
    created_at: str
    aliases: list[str]
    serving: bool = Field(description="whether this server answers with this version (for any model of its set)")
    text_encoders: list[str]
    default_text_encoder: str = Field(description="the variant used when a request names no encoder")
    components: list[str] = Field(description="optional components this version has, e.g. 'dcsm' (dense scoring)")
    metrics: dict[str, float]
    eval: dict[str, object] | None = None
    error: str | None = Field(
        default=None, description="set when the version's manifest cannot be read: it cannot be served"
    )
    auto: AutoInfo | None = Field(
        default=None, description="the serving version under precision=auto / backend=auto: how its backend was picked"
    )


class CanaryInfo(BaseModel):
    version: str
    weight: float = Field(description="percent of the callers routed to it (by X-Canary-Key, else API key)")
    loaded: bool = Field(
        description="whether this server routes that share to it; false while it loads or when it was refused: "
        "the primary answers every request meanwhile"
    )
    problem: str | None = Field(
        default=None,
        description="why it is not loaded, when it was refused (e.g. it does not fit max_loaded_models or "
        "max_loaded_bytes) or its load is being retried; null while it loads or once it is loaded",
    )


class ShadowEndpointInfo(BaseModel):
    compared: int = Field(description="sampled requests whose shadow answer was compared with the one sent")
    dropped: int = Field(
        description="sampled requests not re-run: the shadow queue was full, the serving versions had work "
        "queued, or the shadow changed meanwhile"
    )
    failed: int = Field(description="sampled requests the shadow could not answer")
    agreement: float | None = Field(
        default=None,
        description="share of the decisions on which the shadow agreed with the answer sent: the top-1 label per "
        "image (/classify), the decision per pair (/rank-pair), the top image (/rank), the best caption "
        "(/score/dense)",
    )
    mean_cosine: float | None = Field(
        default=None, description="mean cosine of the shadow's embeddings with those sent (/embed, /v1/embeddings)"
    )
    mean_correlation: float | None = Field(
        default=None,
        description="mean Pearson correlation of the shadow's scores with those sent, over each request's texts "
        "(/score/dense)",
    )


class ShadowInfo(BaseModel):
    version: str
    fraction: float = Field(description="share of the requests re-run on it after they were answered")
    loaded: bool = Field(description="whether this server has it loaded (false: nothing is re-run)")
    endpoints: dict[str, ShadowEndpointInfo] = Field(description="by route template, e.g. '/classify'")
    problem: str | None = Field(
        default=None,
        description="why it is not loaded, when it was refused (it does not fit the memory budget, its embeddings "
        "are not as wide as the primary's, it failed its checks) or its load is being retried",
    )


class ModelInfo(BaseModel):
    name: str
    aliases: dict[str, str]
    serving: str | None = Field(
        default=None,
        description="the version this server answers with for this model name, if any (of the first entry of the "
        "served set with this name)",
    )
    versions: list[VersionInfo]
    error: str | None = Field(default=None, description="set when the model's alias table cannot be read")
    canary: CanaryInfo | None = Field(
        default=None, description="the canary of the alias this server follows, and whether it answers its share here"
    )
    shadow: ShadowInfo | None = Field(
        default=None, description="the shadow of the alias this server follows, and how its answers compare"
    )


class CacheInfo(BaseModel):
    redis: Literal["disabled", "up", "down", "probing"] = Field(
        description="the shared Redis cache: not configured, in use, skipped after failures, or being tried again"
    )
    last_error: str | None = Field(default=None, description="the last Redis error while it is not 'up'")
    lru_items: int = Field(description="embeddings held in this replica's in-process cache")


ServedState = Literal["ready", "loading", "failed", "unloaded", "quarantined"]
SERVED_STATE = (
    "`ready` (serving), `loading`, `failed` (its load failed and is retried; the server log says why), "
    "`unloaded` (held out of memory by `max_loaded_models` until a request names it) or `quarantined` (loaded on "
    "request under `max_loaded_models`, and its last load failed: requests for it get 503 without a load until "
    "`quarantine.until`)"
)


class QuarantineInfo(BaseModel):
    """Why a model loaded on request serves nothing, and until when no request loads it."""

    version: str | None = Field(description="the version whose load failed (null: the ref could not be resolved)")
    reason: str = Field(description="why the load failed, without paths (the server log has the error)")
    refused: bool = Field(
        description="true: the version failed its checksums, manifest, warm-up or parity gate, and is not loaded "
        "again until the entry's alias names another version (read again at `until`); false: it may pass (files "
        "unreadable or not there yet, memory), and the first request after `until` loads it again"
    )
    failures: int = Field(description="failed loads of this version in a row (each doubles the wait, up to 300 s)")
    until: str = Field(
        description="UTC, ISO 8601: before it, requests get 503 `not_ready` with Retry-After and no load is tried"
    )


class ServedModel(BaseModel):
    """One entry of the served set (the `model` setting)."""

    ref: str = Field(description="the entry as configured: `default@production`, `other@v3`, `other`")
    serving: str | None = Field(description="the `name@version` it answers with; null while not loaded")
    state: ServedState = Field(description=SERVED_STATE)
    default: bool = Field(description="whether it answers requests that name no model (the first of the set)")
    store: Literal["ok", "unreadable"] = Field(
        default="ok", description="whether its alias can be read from the model store (hot swaps wait while not)"
    )
    canary: str | None = Field(
        default=None,
        description="the `name@version` of the canary loaded beside it, answering the callers its alias routes there "
        "(a request may also name it as `model`); null when none",
    )
    answers: str | None = Field(
        default=None,
        description="the `name@version` that answers the caller of this request when it names this entry, by its "
        "`X-Canary-Key` header, else its API key (send the same headers as your requests); null while not loaded, "
        "or while a canary splits the callers and this request carries neither key (routed at random)",
    )
    quarantine: QuarantineInfo | None = Field(
        default=None, description="while `state` is `quarantined`: why its load failed and until when; else null"
    )


class ModelsResponse(BaseModel):
    serving: str | None = Field(description="the `name@version` of the default model (null while loading)")
    served: list[ServedModel] = Field(
        default_factory=list, description="GET /models only: every model this server serves, the default first"
    )
    models: list[ModelInfo]
    cache: CacheInfo | None = Field(default=None, description="the embedding cache's state (GET /models only)")


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    ready: bool
    model: str | None = Field(
        description="the `name@version` of the default model; null unless the server lists its models on the "
        "probes (`CLIP_PROBES_LIST_MODELS`)"
    )
    redis: Literal["disabled", "up", "down", "probing"] = Field(
        default="disabled",
        description="the shared embedding cache; the service is ready without it (details in GET /models)",
    )
    store: Literal["ok", "unreadable"] = Field(
        default="ok",
        description="whether the served alias can be read from the model store; while 'unreadable' the loaded "
        "version keeps serving and hot swaps wait (details in the server log)",
    )
    models: list[ServedModel] = Field(
        default_factory=list,
        description="every model of the served set and its state (empty unless `CLIP_PROBES_LIST_MODELS`: "
        "`GET /models` lists them); the server is ready once the first one is",
    )


RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying (always on 429; on 503 when the wait is known)",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def error_response_doc(description: str, retry_after: bool = False) -> dict[str, object]:
    """An OpenAPI ``responses`` entry: the error envelope, and Retry-After where it is sent."""
    doc: dict[str, object] = {"model": ErrorResponse, "description": description}
    if retry_after:
        doc["headers"] = RETRY_AFTER
    return doc


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    400: error_response_doc(
        "bad input (bad_input, bad_image, urls_disabled, url_forbidden), or unsupported_for_family (a method "
        "the serving model's family cannot run)"
    ),
    401: error_response_doc("unauthorized: missing or malformed API key"),
    403: error_response_doc("forbidden: wrong API key"),
    404: error_response_doc(
        "unknown_model, unknown_image, or unknown_component (the serving version lacks "
        "the component the endpoint needs)"
    ),
    413: error_response_doc("payload_too_large"),
    422: error_response_doc("validation_error"),
    429: error_response_doc("overloaded; retry after Retry-After seconds", retry_after=True),
    500: error_response_doc("internal_error"),
    503: error_response_doc(
        "not_ready (no model loaded yet, or the version is being replaced); retry after Retry-After seconds",
        retry_after=True,
    ),
    504: error_response_doc("timeout"),
}
