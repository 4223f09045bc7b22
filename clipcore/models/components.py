"""A version's manifest ``components``, read once into typed fields.

The store keeps ``components`` an open dict (``model_store`` knows no model code); this is what
the entries mean: the weights file and how it is stored, the text-encoder variants and which one
answers by default, and the optional DCSM and YUKINO heads. Entries it does not know (written by
other tools or older code) are kept as they are, so a version derived from one still has them.

``Components.to_manifest`` writes back only what was set: a version whose manifest lacks an entry
(say ``weights_dtype``) reads as the default but is written without it, so a derived version's
manifest is what merging the dicts would have written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

BASE_ENCODER = "base"
# Entries every published version has; any other entry is an optional component.
CORE_COMPONENTS = ("weights", "weights_dtype", "text_encoders", "default_text_encoder")
# Components that need per-token features, which only the CLIP family has.
DENSE_COMPONENTS = ("dcsm", "yukino")

WeightsDtype = Literal["float16", "float32"]


class ComponentsInvalid(ValueError):
    """A manifest's ``components`` do not have the types their readers need; the message names the entry."""


class DCSMComponent(BaseModel):
    """``components["dcsm"]``: the scorer's weights file and its config (``dense.dcsm_component``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    weights: str
    config: dict[str, Any]


class YukinoComponent(BaseModel):
    """``components["yukino"]``: the inverter's file, the text-encoder variant it was trained with,
    and its config (``YukinoHead.to_files``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    file: str
    text_encoder: str
    config: dict[str, Any]


class Components(BaseModel):
    """The parsed ``components`` of one version (``Components.from_manifest``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    weights: str | None = None  # None: the version holds no weights (the load check refuses it)
    weights_dtype: WeightsDtype = "float16"
    text_encoders: dict[str, str] = Field(default_factory=dict)  # variant -> file of its delta
    default_text_encoder: str = BASE_ENCODER
    dcsm: DCSMComponent | None = None
    yukino: YukinoComponent | None = None

    @field_validator("dcsm", "yukino", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        # An empty entry has always read as "no head" (DCSM's loader and GET /models both skip it).
        return value if value else None

    @classmethod
    def from_manifest(cls, components: Mapping[str, Any]) -> Components:
        """Parse a manifest's ``components``; ``ComponentsInvalid`` names every entry of a wrong type."""
        try:
            return cls.model_validate(dict(components))
        except ValidationError as exc:
            raise ComponentsInvalid("; ".join(_describe(error) for error in exc.errors())) from None

    def to_manifest(self) -> dict[str, Any]:
        """The dict a manifest holds: the entries that were set (parsed or passed), unknown ones included."""
        return self.model_dump(exclude_unset=True)

    @property
    def extra(self) -> dict[str, Any]:
        """Entries this model does not know, as the manifest holds them."""
        return dict(self.model_extra or {})

    def has(self, name: str) -> bool:
        """Whether the version has component ``name``: an entry that is set and not empty."""
        if name in type(self).model_fields:
            return name in self.model_fields_set and bool(getattr(self, name))
        return bool(self.extra.get(name))

    @property
    def optional(self) -> list[str]:
        """Names of the optional components the version has (``dcsm``, ``yukino``, unknown ones), sorted."""
        names = [*(c for c in DENSE_COMPONENTS if self.has(c)), *(k for k, v in self.extra.items() if v)]
        return sorted(names)

    @property
    def dense(self) -> list[str]:
        """The components the version has that need per-token features (``DENSE_COMPONENTS``)."""
        return [c for c in DENSE_COMPONENTS if self.has(c)]

    def merged(self, parts: Mapping[str, Any], text_encoders: Mapping[str, str]) -> Components:
        """These components with the entries of ``parts`` replacing same-named ones and
        ``text_encoders`` added to this version's variants (what a derived version records)."""
        out = {**self.to_manifest(), **parts}
        if text_encoders:
            out["text_encoders"] = {**self.text_encoders, **text_encoders}
        return Components.from_manifest(out)


def _describe(error: ErrorDetails) -> str:
    """``components.text_encoders: Input should be a valid dictionary (got 3)``."""
    where = ".".join(str(part) for part in ("components", *error["loc"]))
    if error["type"] == "missing":
        return f"{where}: {error['msg']}"
    shown = repr(error["input"])
    return f"{where}: {error['msg']} (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
