"""``clip-train data ...``: check a dataset before training on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from training.datasets.dataset import load_dataset

data_app = typer.Typer(help="Check a dataset of your own images and texts (docs/data.md).", no_args_is_help=True)
console = Console()


@data_app.command("validate")
def validate(
    path: Annotated[Path, typer.Argument(help="A .jsonl file, a .tar WebDataset shard, or a folder of them.")],
    labels: Annotated[
        Path | None,
        typer.Option(help="The label set (JSON list or label -> attributes); default: labels.json beside the data."),
    ] = None,
) -> None:
    """Report every problem (file and line) and the records of each kind and split; exit 1 on any problem."""
    dataset = load_dataset(path, labels)
    for problem in dataset.problems:
        console.print(f"[red]{problem}[/red]", soft_wrap=True, highlight=False)
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(dataset.counts().items())) or "no records"
    splits = ", ".join(f"{len(dataset.split(s))} {s}" for s in ("train", "val", "test"))
    console.print(f"{len(dataset.items)} usable records ({counts}); splits by image content: {splits}")
    shown = ", ".join(list(dataset.labels)[:10]) + ("..." if len(dataset.labels) > 10 else "")
    console.print(f"labels: {len(dataset.labels)} ({shown})")
    if dataset.problems:
        console.print(f"[red]{len(dataset.problems)} problem(s): fix them before training[/red]")
        raise typer.Exit(1)
