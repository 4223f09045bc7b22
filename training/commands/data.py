"""``clip-train data ...``: check a dataset before training on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from model_store.cli_options import output_console
from training.datasets.dataset import load_dataset

data_app = typer.Typer(help="Check a dataset of your own images and texts (docs/data.md).", no_args_is_help=True)
console = output_console()


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
    if dataset.test_file is not None:
        console.print(f"test part: {dataset.test_file} (so this file's test share is trained on)", soft_wrap=True)
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
    class_folders: Annotated[
        bool,
        typer.Option(help="Write JPEGs into OUT/train/<label>/ and OUT/test/<label>/ instead (for import-folder)."),
    ] = False,
) -> None:
    """Convert Fashion-MNIST's raw IDX files into PNGs and label records, or JPEGs in class folders."""
    from training.datasets.fashion_mnist import convert, write_class_folders

    missing = [p for p in ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz") if not (source / p).exists()]
    if missing:
        console.print(f"[red]{source} lacks {', '.join(missing)} (apt-get install dataset-fashion-mnist)[/red]")
        raise typer.Exit(1)
    if class_folders:
        counts = write_class_folders(source, out, limit, test_limit)
        console.print(
            f"wrote {counts['train']} training and {counts['test']} test photos into {out}/{{train,test}}/<label>/"
        )
        return
    counts = convert(source, out, limit, test_limit)
    console.print(f"wrote {counts['train']} training and {counts['test']} test records under {out}")


@data_app.command("import-folder")
def import_folder(
    root: Annotated[
        Path, typer.Argument(help="A folder of class folders (ROOT/<class>/<image>), or of train/ and test/ ones.")
    ],
    out: Annotated[Path, typer.Argument(help="Folder to write labels.json, train.jsonl, test.jsonl and images/ into.")],
    split_from: Annotated[
        Path | None,
        typer.Option(
            help="A second folder of class folders to use as the test part (default: test/ under ROOT, "
            "else the images whose content falls in the test split, 10 %)."
        ),
    ] = None,
    attributes: Annotated[
        Path | None,
        typer.Option(help="A labels.json of label -> {attribute: value} (or a list of labels) for the classes."),
    ] = None,
    copy: Annotated[
        bool, typer.Option(help="Copy the images under OUT/images, or (--no-copy) name the originals in the records.")
    ] = True,
) -> None:
    """Convert a folder of class folders (torchvision's ImageFolder layout) into label records (docs/data.md)."""
    from training.datasets.folder import FolderProblems
    from training.datasets.folder import import_folder as convert

    try:
        result = convert(root, out, split_from=split_from, attributes=attributes, copy=copy)
    except FolderProblems as exc:
        for problem in exc.problems:
            console.print(f"[red]{problem}[/red]", soft_wrap=True, highlight=False)
        console.print(f"[red]{len(exc.problems)} problem(s): nothing written[/red]", highlight=False)
        raise typer.Exit(1) from None
    shown = ", ".join(result.labels[:10]) + ("..." if len(result.labels) > 10 else "")
    console.print(
        f"wrote {result.train} training and {result.test} test records under {out} (test part: {result.test_from})",
        soft_wrap=True,
        highlight=False,
    )
    console.print(f"labels: {len(result.labels)} ({shown})", soft_wrap=True, highlight=False)
    if result.skipped:
        console.print(f"skipped {result.skipped} file(s) that are not images", highlight=False)
    if result.test == 0:
        console.print("[yellow]the test part is empty: give a test folder with --split-from[/yellow]")
