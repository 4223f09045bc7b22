"""The offline training job (``clip-train``): shapes-world data, base CLIP, the methods on the
shapes world or a user's data, evaluation, publishing. The commands are in ``training.commands``.

Separate from the server; everything it produces goes through the model store.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from model_store.errors import StoreError
from model_store.version import print_version
from training.commands import register
from training.options import GroupStoreOpt

app = typer.Typer(
    help="Train, evaluate and publish CLIP models: on your own images and texts (docs/data.md) or the shapes world.",
    no_args_is_help=True,
)
register(app)


@app.callback()
def _main(
    store: GroupStoreOpt = "models",
    show_version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=print_version, is_eager=True)
    ] = False,
) -> None:
    """Options that apply to every command (each command that opens a store reads this --store
    unless it is given its own)."""


def main() -> None:
    """``clip-train``: the app, with a store error (no such model, version or alias; no store there)
    said in one line instead of a traceback."""
    try:
        app()
    except StoreError as exc:
        Console(stderr=True, soft_wrap=True, highlight=False).print(f"[red]error:[/red] {escape(str(exc))}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
