"""The command line of ``python -m service``, generated from the settings model.

Every field of ``service.config.Settings`` is a flag, nested groups included: the setting
``batching.max_batch_images`` is ``--batching-max-batch-images`` and ``CLIP_BATCHING__MAX_BATCH_IMAGES``.
Type, default and help come from the field, so a new setting gets its flag (and its row in
docs/configuration.md) without anything else to edit. Flags win over variables, variables over
defaults: ``parse_args`` returns only the flags given, as nested values that pydantic-settings
merges over the environment.

pydantic-settings has a command line of its own (``CliSettingsSource``); it was not used because
it names nested flags with a dot (``--batching.max-batch-images``; the dash form only as a
per-field alias listed twice in the help), shows the default of every grouped setting as
``default factory: Settings.<lambda>``, and parses while ``Settings`` is built, so the flags given
cannot be told apart from the environment for the reference page or an error message.

This module imports argparse and the settings model only: ``--help`` and ``--version`` must not
load the application (torch, open_clip); ``service.__main__`` imports that after parsing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from model_store.version import package_version
from service.config import Settings

ENV_PREFIX: str = Settings.model_config.get("env_prefix") or ""
NESTED_DELIMITER: str = Settings.model_config.get("env_nested_delimiter") or "__"

# CLIP_* variables that other programs of this repository read: not settings of the service, and
# not misspellings of one, so the service does not warn about them.
OTHER_PROGRAMS_VARIABLES: dict[str, str] = {
    "CLIP_SERVICE_URL": "the Python client (clients/python): the server's URL",
    "CLIP_SERVICE_API_KEY": "the Python client (clients/python): the API key it sends",
    "CLIP_FEATURE_CACHE": "clip-train: where frozen image features are kept",
    "CLIP_UPDATE_SCREENSHOTS": "the playground's browser test: write its screenshots into docs/images",
    "CLIP_UPDATE_DOC_OUTPUTS": "the documentation test: write the service's answers into the docs' examples",
}

# argparse metavars, in the words typer uses for the other two command lines.
_METAVARS: dict[Any, str] = {str: "TEXT", int: "INTEGER", float: "NUMBER", Path: "PATH", SecretStr: "SECRET"}
_NONE_WORDS = ("none", "null")


@dataclass(frozen=True)
class SettingFlag:
    """One setting: where it sits in ``Settings`` and its names on the command line and in the environment."""

    path: tuple[str, ...]  # ("batching", "max_batch_images")
    field: FieldInfo

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        return "--" + "-".join(self.path).replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + NESTED_DELIMITER.join(part.upper() for part in self.path)

    @property
    def annotation(self) -> Any:
        """The field's type without ``| None``."""
        return _without_none(self.field.annotation)

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.field.annotation)

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.annotation) is list

    @property
    def is_bool(self) -> bool:
        return self.annotation is bool

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return typing.get_args(self.annotation) if typing.get_origin(self.annotation) is typing.Literal else None

    @property
    def secret(self) -> bool:
        item = typing.get_args(self.annotation)[0] if self.is_list else self.annotation
        return item is SecretStr

    @property
    def metavar(self) -> str:
        item = typing.get_args(self.annotation)[0] if self.is_list else self.annotation
        return _METAVARS.get(item, "VALUE")

    def usage(self) -> str:
        """How the flag is written: ``--port INTEGER``, ``--warmup/--no-warmup``, ``--log-level {debug,...}``."""
        if self.is_bool:
            return f"{self.flag}/--no-{self.flag[2:]}"
        if self.choices:
            return f"{self.flag} {{{','.join(map(str, self.choices))}}}"
        return f"{self.flag} {self.metavar}"


def _without_none(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _group_model(field: FieldInfo) -> type[BaseModel] | None:
    ann = field.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def settings_flags(model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()) -> list[SettingFlag]:
    """Every setting, groups flattened, in the order of the model. A setting without a
    ``Field(description=...)`` is an error: its flag and its row in the reference would be empty."""
    flags: list[SettingFlag] = []
    for name, field in model.model_fields.items():
        group = _group_model(field)
        if group is not None:
            flags += settings_flags(group, (*prefix, name))
            continue
        if not field.description:
            raise ValueError(f"setting {'.'.join((*prefix, name))!r} has no description: add Field(description=...)")
        flags.append(SettingFlag((*prefix, name), field))
    return flags


def setting_groups() -> dict[str, type[BaseModel]]:
    """The nested groups of ``Settings`` (``limits``, ``batching``) by name."""
    return {name: model for name, field in Settings.model_fields.items() if (model := _group_model(field))}


def default_text(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def _help(setting: SettingFlag) -> str:
    # argparse %-formats help texts: a literal % must be doubled. Backticks are Markdown, for the reference page.
    text = (setting.field.description or "").replace("`", "").replace("%", "%%")
    notes = [f"env {setting.env}", f"default {default_text(setting.field)}"]
    if setting.is_list:
        notes.append("repeat the flag for several values, or give a JSON list as the variable takes")
    if setting.optional:
        notes.append("none unsets it")
    text += " [" + "; ".join(notes) + "]"
    if setting.secret:
        text += (
            f" Prefer the variable {setting.env}"
            + (" or --api-keys-file" if setting.key == "api_keys" else "")
            + ": a flag's value is visible to every user of the machine in ps and lands in shell history."
        )
    return text


def _list_values(text: str) -> list[str]:
    """One ``--cors-origins`` value, or a JSON list of them (as the environment variable takes)."""
    if not text.lstrip().startswith("["):
        return [text]
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise argparse.ArgumentTypeError("a JSON list of strings is expected")
    return values


def _optional(text: str) -> str | None:
    return None if text.strip().lower() in _NONE_WORDS else text


def _lower(text: str) -> str:
    return text.lower()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clip-service",
        # The generated usage line lists every flag (60 lines): an error message would scroll away under it.
        usage="%(prog)s [options]",
        description="Run the CLIP scoring HTTP service under uvicorn. Every setting is a flag and a CLIP_* "
        "environment variable; a flag wins over its variable, a variable over the default "
        "(reference: docs/configuration.md).",
        # Only the flags given appear in the namespace: that is what lets them win over the environment.
        argument_default=argparse.SUPPRESS,
        # A prefix of a flag is not taken for the flag: a deployment script that abbreviates would break
        # the day a new setting shares the prefix.
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=package_version(), help="Print the version and exit.")
    groups: dict[str, Any] = {"": parser.add_argument_group("settings")}
    for name, model in setting_groups().items():
        doc = " ".join((model.__doc__ or "").split()).replace("``", "")
        groups[name] = parser.add_argument_group(f"{name} ({ENV_PREFIX}{name.upper()}{NESTED_DELIMITER}*)", doc)
    for setting in settings_flags():
        group = groups[setting.path[0] if len(setting.path) > 1 else ""]
        kwargs: dict[str, Any] = {"dest": setting.key, "help": _help(setting)}
        if setting.is_bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif setting.choices:
            kwargs["choices"] = setting.choices
            if all(isinstance(c, str) and c == c.lower() for c in setting.choices):
                kwargs["type"] = _lower  # the variable is case-insensitive (CLIP_LOG_LEVEL=DEBUG): so is the flag
        elif setting.is_list:
            kwargs.update(action="append", type=_list_values, metavar=setting.metavar)
        else:
            # The text goes to pydantic as it is, so a flag converts and fails exactly as its variable does.
            kwargs.update(type=_optional if setting.optional else str, metavar=setting.metavar)
        group.add_argument(setting.flag, **kwargs)
    return parser


def parse_args(argv: Sequence[str] | None) -> dict[str, Any]:
    """The flags given, as (nested) init values of ``Settings``: ``{"batching": {"max_batch_images": "8"}}``.

    ``--help`` and ``--version`` print and exit; a malformed flag exits 2 with argparse's message.
    """
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{_flag_suggestion(unknown)}")
    given = vars(namespace)
    overrides: dict[str, Any] = {}
    for setting in settings_flags():
        if setting.key not in given:
            continue
        value = given[setting.key]
        if setting.is_list:  # one list per use of the flag: join them
            value = [item for values in value for item in values]
        target = overrides
        for part in setting.path[:-1]:
            target = target.setdefault(part, {})
        target[setting.path[-1]] = value
    return overrides


def _flag_suggestion(unknown: Sequence[str]) -> str:
    flags = [s.flag for s in settings_flags()] + [f"--no-{s.flag[2:]}" for s in settings_flags() if s.is_bool]
    for arg in unknown:
        close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1) if arg.startswith("--") else []
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def known_variables() -> set[str]:
    """Every ``CLIP_*`` name something here reads: the settings, their groups as JSON, other programs'."""
    names = {setting.env for setting in settings_flags()}
    names |= {f"{ENV_PREFIX}{name.upper()}" for name in setting_groups()}
    return names | set(OTHER_PROGRAMS_VARIABLES)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One warning per ``CLIP_*`` variable that nothing reads, naming the closest known name.

    pydantic-settings ignores an unknown top-level variable without a word (and refuses an unknown
    one inside a group), so a misspelt ``CLIP_*`` would otherwise leave its setting at the default.
    """
    known = known_variables()
    warnings = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings matches the names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        warnings.append(f"unknown variable {name} (not a setting of the service): {_suggestion(upper, known)}")
    return warnings


def _suggestion(name: str, known: Iterable[str]) -> str:
    # Compared without the prefix that every name shares, which would make any two names look alike.
    stems = {k[len(ENV_PREFIX) :]: k for k in known}
    close = difflib.get_close_matches(name[len(ENV_PREFIX) :], list(stems), n=1)
    return f"did you mean {stems[close[0]]}?" if close else "the settings are listed in docs/configuration.md"


def describe_errors(exc: ValidationError) -> str:
    """One line per invalid setting, naming its flag and variable; secret values are not echoed."""
    by_key = {setting.key: setting for setting in settings_flags()}
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        setting = by_key.get(key)
        if setting is None:
            lines.append(f"  {key}: {message}" if key else f"  {message}")
            continue
        value = error.get("input")
        shown = "" if setting.secret or value is None or isinstance(value, dict | list) else f" (got {value!r})"
        lines.append(f"  {setting.flag} / {setting.env}: {message}{shown}")
    return "\n".join(lines)
