"""``clip-train tune``: the command line of ``clipcore.backends.tune`` (the work is there)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from model_store import ModelStore
from model_store.cli_options import output_console
from training.options import StoreOpt


def tune_cmd(
    ref: Annotated[str, typer.Argument(help="Version in the store: name, name@alias or name@version.")],
    store: StoreOpt = "models",
    threads: Annotated[
        int, typer.Option(help="The servers' CLIP_TORCH_THREADS (part of the key: 0 is the library default).")
    ] = 0,
    precision: Annotated[
        str, typer.Option(help="The servers' CLIP_PRECISION: auto, or fp32 / int8 with CLIP_BACKEND=auto.")
    ] = "auto",
    device: Annotated[str, typer.Option(help="The servers' device: cpu, cuda or cuda:N.")] = "cpu",
    max_batch: Annotated[
        int, typer.Option(help="The servers' CLIP_BATCHING__MAX_BATCH_IMAGES (a part of the key on CUDA only).")
    ] = 64,
    seconds: Annotated[float, typer.Option(help="Timing per candidate (more on a retry after a deferral).")] = 3.0,
    attempts: Annotated[int, typer.Option(help="Timings before giving up when the rounds cannot settle it.")] = 3,
    fail: Annotated[
        bool, typer.Option(help="Exit 1 when nothing is written (--no-fail: 0, so a Job's next step still runs).")
    ] = True,
) -> None:
    """Decide `auto` once for this node's CPU kind: time the candidates here (run it on a quiet node,
    or as the clip-tune Job) and write the decision and the winner's exported graphs into the store,
    where every server of this CPU kind and these settings reads them instead of exporting and timing."""
    from clipcore.backends.tune import TuneError, tune

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("clipcore").setLevel(logging.INFO)  # the candidates' figures and the decision
    console = output_console(soft_wrap=True, highlight=False)
    try:
        done = tune(ModelStore(store), ref, device=device, threads=threads or None, precision=precision,
                    seconds=seconds, attempts=attempts, max_batch=max_batch)  # fmt: skip
    except TuneError as exc:
        Console(stderr=True, soft_wrap=True, highlight=False).print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1 if fail else 0) from None
    d, written = done.decision, done.written
    figures = f"{d.margin or 1.0:.2f}x torch fp32, spread {d.spread or 0.0:.2f} over {d.rounds} rounds"
    console.print(f"tuned {done.ref} on {escape(str(written.meta['tuned_on']))}: {d.backend} {d.precision} ({figures})")
    console.print(f"shared as {written.key}: {', '.join(sorted(written.files)) or 'no files (a torch runtime)'}")
