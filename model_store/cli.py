"""``model-store`` command line: inspect, verify, publish, promote and collect model versions.

Every ``StoreError`` becomes a one-line red message and exit code 1, so the
commands compose in deployment scripts without tracebacks. The store is ``--store`` (before or
after the command) or the ``CLIP_STORE`` environment variable (the name the service reads too;
``MODEL_STORE`` is still read as a deprecated alias). ``publish``, ``promote`` and ``verify`` also run the installed
version validators (``model_store.validators``): a version whose model cannot load is refused.
"""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from model_store.cli_options import DEFAULT_STORE, STORE_ENV, GroupStoreOpt, StoreOpt
from model_store.errors import StoreError
from model_store.location import missing_directory
from model_store.naming import DEFAULT_ALIAS, MANIFEST_FILE
from model_store.store import ModelStore
from model_store.validators import InstalledValidators, installed_validator_names
from model_store.version import print_version

app = typer.Typer(
    name="model-store",
    help="Versioned model registry: list, show, verify, publish, promote, rollback, gc. "
    "To import a model from open_clip files (checkpoint, hub folder, cached tag): clip-train import.",
    no_args_is_help=True,
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")

AliasOpt = Annotated[str, typer.Option("--alias", "-a", help="Alias to change.")]


def _out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _handles_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn store errors into a single red line on stderr and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except StoreError as exc:
            Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(code=1) from None

    return wrapper


@dataclass(frozen=True)
class _GroupOptions:
    load_check: bool


def _store(ctx: typer.Context, location: str, must_exist: bool = True) -> ModelStore:
    """The store at ``location`` (--store); commands that read it refuse a root that does not exist
    (a typo in a path must not look like an empty store)."""
    if must_exist and missing_directory(location):
        raise StoreError(f"no model store at {location} (set by --store or {STORE_ENV}): the directory does not exist")
    options = ctx.find_object(_GroupOptions)
    load_check = options.load_check if options is not None else True
    return ModelStore(location, validator=InstalledValidators() if load_check else None)


@app.callback()
def main(
    ctx: typer.Context,
    store: GroupStoreOpt = DEFAULT_STORE,
    load_check: Annotated[
        bool,
        typer.Option(
            "--load-check/--no-load-check",
            help="Run the installed validators (build the model, smoke forward pass) at publish, promote and "
            "verify. --no-load-check leaves checksums and manifest checks only.",
        ),
    ] = True,
    show_version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=print_version, is_eager=True)
    ] = False,
) -> None:
    """Operate on the model registry at --store (env CLIP_STORE)."""
    # The store opens in the command: a --store after the command name is parsed only after this runs.
    ctx.obj = _GroupOptions(load_check=load_check)


@app.command("list")
@_handles_errors
def list_cmd(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="Show the versions of one model.")] = None,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """List models with their versions and aliases, or the versions of one model."""
    store = _store(ctx, store_location)
    if name is None:
        models = store.list_models()
        if not models:
            _out().print(f"no models in {escape(store_location)}")
            return
        table = Table("model", "versions", DEFAULT_ALIAS, "aliases")
        for model in models:
            aliases = store.aliases(model)
            table.add_row(
                model,
                ", ".join(store.list_versions(model)),
                aliases.get(DEFAULT_ALIAS, "-"),
                ", ".join(f"{a}={v}" for a, v in sorted(aliases.items())),
            )
        _out().print(table)
        return
    by_version: dict[str, list[str]] = {}
    for alias, version in sorted(store.aliases(name).items()):
        by_version.setdefault(version, []).append(alias)
    table = Table("version", "created", "files", "bytes", "aliases", title=name)
    for version in store.list_versions(name):
        manifest = store.manifest(name, version)
        table.add_row(
            version,
            manifest.created_at,
            str(len(manifest.files)),
            f"{manifest.total_bytes:,}",
            ", ".join(by_version.get(version, [])),
        )
    _out().print(table)


@app.command()
@_handles_errors
def show(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="name, name@alias or name@version.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw manifest.")] = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Show a version's manifest summary, files and metrics."""
    store = _store(ctx, store_location)
    name, version = store.resolve(ref)
    manifest = store.manifest(name, version)
    out = _out()
    if as_json:
        out.print_json(manifest.to_json())
        return
    aliases = [a for a, v in sorted(store.aliases(name).items()) if v == version]
    summary = Table.grid(padding=(0, 2))
    for key, value in [
        ("ref", manifest.ref),
        ("aliases", ", ".join(aliases) or "-"),
        ("created_at", manifest.created_at),
        ("architecture", json.dumps(manifest.architecture, sort_keys=True)),
        ("tokenizer", f"{manifest.tokenizer} (context {manifest.context_length})"),
        ("embed_dim", str(manifest.embed_dim)),
        ("image_size", str(manifest.image_size)),
        ("preprocess", json.dumps(manifest.preprocess, sort_keys=True)),
        ("hooks", ", ".join(manifest.hooks) or "-"),
        ("components", json.dumps(manifest.components, sort_keys=True)),
        ("annex", ", ".join(store.annex_files(name, version)) or "-"),
        ("notes", manifest.notes or "-"),
    ]:
        summary.add_row(f"[bold]{key}[/bold]", escape(value))
    out.print(summary)
    files = Table("file", "bytes", "sha256", title="files")
    for filename, entry in sorted(manifest.files.items()):
        files.add_row(filename, f"{entry.bytes:,}", entry.sha256[:16])
    out.print(files)
    if manifest.metrics:
        metrics = Table("metric", "value", title="metrics")
        for metric, figure in sorted(manifest.metrics.items()):
            metrics.add_row(metric, f"{figure:.4f}")
        out.print(metrics)


@app.command()
@_handles_errors
def verify(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="name, name@alias or name@version.")],
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Recompute the checksums of every file of a version, then load and run its model."""
    store = _store(ctx, store_location)
    name, version = store.resolve(ref)
    store.verify(name, version)
    manifest = store.manifest(name, version)
    if store.validator is not None:
        try:
            store.validator(manifest, store.version_dir(name, version))
        except Exception as exc:  # the validator's reason is the message
            raise StoreError(f"{name}@{version} does not load: {exc}") from exc
    checked = "; the model loads and runs" if store.validator and installed_validator_names() else " (not loaded)"
    _out().print(f"[green]ok[/green] {name}@{version}: {len(manifest.files)} files match their sha256{checked}")


@app.command()
@_handles_errors
def promote(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="name@version (or name@alias) to promote.")],
    alias: AliasOpt = DEFAULT_ALIAS,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Verify a version and point an alias at it (the old target is kept for rollback)."""
    if "@" not in ref:
        raise StoreError(f"promote needs name@version, got {ref!r}")
    store = _store(ctx, store_location)
    name, version = store.resolve(ref)
    previous = store.promote(name, alias, version)
    _out().print(f"{name}@{alias}: {previous or '-'} -> {version}")


@app.command()
@_handles_errors
def rollback(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    alias: AliasOpt = DEFAULT_ALIAS,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Return an alias to the version it pointed to before the last promotion."""
    store = _store(ctx, store_location)
    current = store.alias_target(name, alias)
    target = store.rollback(name, alias)
    _out().print(f"{name}@{alias}: {current or '-'} -> {target}")


@app.command()
@_handles_errors
def gc(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    keep: Annotated[int, typer.Option("--keep", min=0, help="Also keep the newest N versions.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print what would be removed.")] = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Remove versions no alias (or alias history) references, and stale staging dirs."""
    removed = _store(ctx, store_location).gc(name, keep_latest=keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    _out().print(f"{verb}: {', '.join(removed)}" if removed else "nothing to remove")


@app.command()
@_handles_errors
def publish(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    directory: Annotated[Path, typer.Argument(help="Directory whose files form the version.", file_okay=False)],
    manifest_json: Annotated[Path, typer.Option("--manifest-json", help="JSON file of manifest fields.")],
    version: Annotated[
        str | None, typer.Option("--version", help="Version name (default: the manifest's, else next vN).")
    ] = None,
    alias: Annotated[list[str] | None, typer.Option("--alias", "-a", help="Alias to point at it.")] = None,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Publish every file under DIRECTORY as a new immutable version.

    A top-level manifest.json in DIRECTORY is skipped (publish writes its own), and
    a ``files`` table in the manifest JSON is ignored (it is recomputed).
    """
    fields = _read_fields(manifest_json)
    if not directory.is_dir():
        raise StoreError(f"{directory} is not a directory")
    files = {
        path.relative_to(directory).as_posix(): path
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).as_posix() != MANIFEST_FILE
    }
    manifest = _store(ctx, store_location, must_exist=False).publish(
        name, files, fields, version=version, aliases=alias or ()
    )
    size = f"{len(manifest.files)} files, {manifest.total_bytes:,} bytes"
    _out().print(f"[green]published[/green] {manifest.ref} ({size})")


def _read_fields(path: Path) -> dict[str, Any]:
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read manifest fields from {path}: {exc}") from None
    if not isinstance(fields, dict):
        raise StoreError(f"{path} must hold a JSON object")
    fields.pop("files", None)
    return fields


if __name__ == "__main__":
    app()
