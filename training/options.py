"""Command-line options shared by every ``clip-train`` command."""

from __future__ import annotations

from typing import Annotated

import typer

# A string, not a Path: pathlib would turn s3://bucket/prefix into s3:/bucket/prefix. CLIP_STORE is
# the one name the service and both command lines read; MODEL_STORE is a deprecated alias.
StoreOpt = Annotated[
    str,
    typer.Option(
        "--store",
        envvar=["CLIP_STORE", "MODEL_STORE"],
        help="Model store: a directory or s3://bucket/prefix (env CLIP_STORE).",
    ),
]
