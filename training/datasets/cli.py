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


@data_app.command("fashion-mnist")
def fashion_mnist(
    out: Annotated[Path, typer.Argument(help="Folder to write labels.json, train.jsonl, test.jsonl and images/ into.")],
    source: Annotated[Path, typer.Option(help="Folder of the four raw *-ubyte.gz files.")] = Path(
        "/usr/share/datasets/fashion-mnist"
    ),
    limit: Annotated[int | None, typer.Option(help="Keep the first N training images.")] = None,
    test_limit: Annotated[int | None, typer.Option(help="Keep the first N test images.")] = None,
) -> None:
    """Convert Fashion-MNIST's raw IDX files into PNGs and label records (docs/tutorial.md)."""
    from training.datasets.fashion_mnist import convert

    missing = [p for p in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz") if not (source / p).exists()]
    if missing:
        console.print(f"[red]{source} lacks {', '.join(missing)} (apt-get install dataset-fashion-mnist)[/red]")
        raise typer.Exit(1)
    counts = convert(source, out, limit, test_limit)
    console.print(f"wrote {counts['train']} training and {counts['test']} test records under {out}")
