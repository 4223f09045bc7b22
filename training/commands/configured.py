"""Commands whose flags are generated from dataclasses and whose values may come from a file.

A method's command (``clip-train pcclip``, ...) reads two dataclasses: the run's options (which
model, data, store, device ...: ``RunOptions`` in ``training.commands.userdata``) and the method's
run configuration (``PCClipRun``, a subclass of the method's ``Hyper``). ``configured_command``
makes one flag per scalar field of each (``batch_size`` -> ``--batch-size``), so a flag cannot
drift from the field it sets, and adds ``--config FILE``: a JSON object (a ``.yaml`` / ``.yml``
file: a YAML mapping) whose keys are those fields (nested ones, such as YUKINO's ``oti`` and
``text``, and tuples, such as SemCLIP's ``weights``, are set only there). A value is the field's
default, else the file's, else a flag given on the command line (or its environment variable).
Values are checked by pydantic against the fields' types, so a wrong key or type is said in one line, never a traceback.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import pydantic
import typer
import yaml

_SCALARS = (int, float, str, bool, Path)
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A JSON or YAML (.yaml/.yml) file of this command's settings (keys: the flags' names with "
        "underscores, and the method's nested settings); flags given as well override it.",
    ),
]


class ConfigError(ValueError):
    """A configuration file or value that does not fit the command's fields."""


@dataclass(frozen=True)
class FlagSpec:
    """How a field is spelt on the command line (default: ``--field-name``)."""

    help: str
    decls: tuple[str, ...] = ()
    envvar: str | None = None
    annotation: Any = None  # a ready ``Annotated`` type (e.g. the shared ``--store``) used as is


def _flag_type(hint: Any) -> Any | None:
    """The option type of a field whose values a flag can spell, else None (config file only)."""
    if hint in _SCALARS:
        return hint
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and (args[0] in _SCALARS or get_origin(args[0]) is list):
            return hint
    if get_origin(hint) is list and get_args(hint)[0] in _SCALARS:
        return hint
    return None


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def flag_fields(cls: type, specs: Mapping[str, FlagSpec]) -> list[tuple[str, Any, Any, FlagSpec]]:
    """(name, type, default, spec) of every field of ``cls`` a flag can spell. A field without a
    spec is an error here, so a new field cannot reach the command line without its help."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        hint = _flag_type(hints[f.name])
        if hint is None:
            continue
        if f.name not in specs:
            raise KeyError(f"{cls.__name__}.{f.name} has no FlagSpec (its flag's help)")
        out.append((f.name, hint, _default(f), specs[f.name]))
    return out


YAML_SUFFIXES = (".yaml", ".yml")


def read_config(path: Path) -> dict[str, Any]:
    """The settings in ``path``: a YAML mapping when its name ends in ``.yaml`` / ``.yml``, else a
    JSON object."""
    is_yaml = path.suffix.lower() in YAML_SUFFIXES
    kind = "YAML mapping" if is_yaml else "JSON object"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    try:
        # safe_load: a settings file builds plain values, never Python objects.
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--config {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"--config {path}: not YAML ({getattr(exc, 'problem', None) or exc}{where})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: a {kind} of settings is expected, not {type(data).__name__}")
    return data


def build(cls: type[Any], values: Mapping[str, Any], source: str) -> Any:
    """An instance of dataclass ``cls`` from ``values`` (its defaults for the rest), types checked."""
    try:
        return pydantic.TypeAdapter(cls).validate_python(dict(values), strict=False)
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False))
        raise ConfigError(f"{source}: {problems}") from None


def split_values(values: Mapping[str, Any], classes: Sequence[type], source: str) -> list[dict[str, Any]]:
    """``values`` split by the dataclass whose field each key is; an unknown key is an error."""
    names = [{f.name for f in fields(c)} for c in classes]
    unknown = sorted(set(values) - set().union(*names))
    if unknown:
        known = ", ".join(sorted(set().union(*names)))
        raise ConfigError(f"{source}: unknown setting(s) {', '.join(unknown)} (known: {known})")
    return [{k: v for k, v in values.items() if k in n} for n in names]


def configured_command(
    classes: Sequence[type],
    specs: Mapping[str, FlagSpec],
    run: Callable[..., None],
    on_error: Callable[[ConfigError], None],
    doc: str,
) -> Callable[..., None]:
    """A Typer command with ``--config`` and one flag per scalar field of ``classes``; it calls
    ``run(*instances)`` with one instance of each class (file, then flags given, over the
    defaults), or ``on_error`` with what did not fit."""
    for c in classes:
        assert is_dataclass(c), c
    flags = [flag for c in classes for flag in flag_fields(c, specs)]
    names = [name for name, *_ in flags]
    if len(names) != len(set(names)):
        raise ValueError(f"two classes share a field: {sorted(n for n in names if names.count(n) > 1)}")
    params = [
        inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOpt),
    ]
    for name, hint, default, spec in flags:
        flag = "--" + name.replace("_", "-")
        decls = spec.decls or ((f"{flag}/--no-{flag[2:]}",) if hint is bool else (flag,))
        annotation = spec.annotation or Annotated[hint, typer.Option(*decls, help=spec.help, envvar=spec.envvar)]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))

    def command(**values: Any) -> None:
        ctx: typer.Context = values.pop("ctx")
        path: Path | None = values.pop("config")
        # Compared by name: typer ships its own copy of click, whose ParameterSource is not public.
        given = {k: v for k, v in values.items() if getattr(ctx.get_parameter_source(k), "name", "") != "DEFAULT"}
        try:
            settings = read_config(path) if path is not None else {}
            parts = split_values(settings, classes, f"--config {path}")
            instances = [build(c, {**part, **{k: v for k, v in given.items() if k in part or _has(c, k)}},
                               f"--config {path}" if path else "flags")  # fmt: skip
                         for c, part in zip(classes, parts, strict=True)]  # fmt: skip
        except ConfigError as exc:
            on_error(exc)
            return
        run(*instances)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = run.__name__
    return command


def _has(cls: type, name: str) -> bool:
    return any(f.name == name for f in fields(cls))


def options_command(cls: type[Any], run: Callable[[Any], None]) -> Callable[..., None]:
    """A Typer command whose parameters are the fields of dataclass ``cls``, each declared with its
    own ``Annotated[type, typer.Option(...)]`` (or ``typer.Argument``); it calls ``run(cls(...))``.
    A command with many flags thereby keeps them as data, not as a function's parameters."""
    hints = get_type_hints(cls, include_extras=True)
    params = []
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        default = inspect.Parameter.empty if required else _default(f)
        params.append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name])
        )

    def command(**values: Any) -> None:
        run(cls(**values))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = run.__doc__
    command.__name__ = run.__name__
    return command
