"""What both command lines (``model-store``, ``clip-train``) share: ``--store``, before or after the
command, and the console their output is printed on.

The group takes ``--store`` and reads ``CLIP_STORE`` (the service's variable too; ``MODEL_STORE`` is
a deprecated alias), and every command that opens a store takes ``--store`` as well, where a flag
given wins. So ``model-store --store s3://b/p list`` and ``model-store list --store s3://b/p`` are
the same command, as are ``clip-train --store m show-eval x`` and ``clip-train show-eval x --store m``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.console import Console

STORE_ENV = "CLIP_STORE"
DEPRECATED_STORE_ENV = "MODEL_STORE"
DEFAULT_STORE = "models"
_LOCATION = "a directory or s3://bucket/prefix"


def _store_of_group(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    """The command's ``--store`` when given on its command line, else the group's (flag, variable or default)."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    # Compared by name: typer ships its own copy of click, whose ParameterSource is not public.
    if getattr(source, "name", None) == "COMMANDLINE":
        return value
    group_value = ctx.find_root().params.get("store") if ctx.find_root() is not ctx else None
    return group_value if isinstance(group_value, str) else value


# A string, not a Path: pathlib would turn s3://bucket/prefix into s3:/bucket/prefix.
GroupStoreOpt = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=[STORE_ENV, DEPRECATED_STORE_ENV],
        help=f"Model store: {_LOCATION} (env {STORE_ENV}; {DEPRECATED_STORE_ENV} is a deprecated alias). "
        "Also accepted after the command.",
    ),
]

# The variables are read here too, for a command run without its group (a test runner, another app).
StoreOpt = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=[STORE_ENV, DEPRECATED_STORE_ENV],
        callback=_store_of_group,
        help=f"Model store: {_LOCATION} (env {STORE_ENV}). Also accepted before the command.",
    ),
]


# Piped or captured output (a file, a CI log, ``| grep``) is not a terminal: rich would lay it out
# for 80 columns, wrapping lines and cutting table cells ("2026-11…"). There it takes the width its
# lines and cells need; COLUMNS, when set, still decides.
UNBOUNDED_WIDTH = 10_000


def output_console(**options: Any) -> Console:
    """A rich console for a command's output: the terminal's width on a terminal, else unbounded."""
    console = Console(**options)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=UNBOUNDED_WIDTH, **options)
    return console
