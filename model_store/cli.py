"""``model-store`` command line: inspect, verify, publish, promote and collect model versions.

Every ``StoreError`` becomes a one-line red message and exit code 1 (3 when an alias move's
precondition failed: ``--expect``, a running canary without ``--replace``, a rollback already
made), so the commands compose in deployment scripts without tracebacks. The store is ``--store`` (before or
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
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from model_store.alias_views import entry_text, history_table, print_gate
from model_store.cli_options import DEFAULT_STORE, STORE_ENV, GroupStoreOpt, StoreOpt, output_console
from model_store.copying import parse_target
from model_store.errors import PreconditionFailed, StoreError
from model_store.gate import GatePolicy
from model_store.location import missing_directory
from model_store.naming import DEFAULT_ALIAS, MANIFEST_FILE
from model_store.store import STAGING_GRACE_S, ModelStore
from model_store.validators import InstalledValidators, installed_validator_names
from model_store.version import print_version

app = typer.Typer(
    name="model-store",
    help="Versioned model registry: list, show, verify, publish, copy, promote, canary, shadow, rollback, "
    "history, gate, policy, gc. "
    "To import a model from open_clip files (checkpoint, hub folder, cached tag): clip-train import.",
    no_args_is_help=True,
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")

AliasOpt = Annotated[str, typer.Option("--alias", "-a", help="Alias to change.")]


def _out() -> Console:
    return output_console(highlight=False, soft_wrap=True)


def _progress() -> Callable[[str], None]:
    """Where an alias move says what it waits for (hashing, the load check, another writer's
    lock): stderr, as it happens, so stdout keeps only the outcome for scripts."""
    console = output_console(stderr=True, highlight=False, soft_wrap=True)
    return lambda line: _print_flushed(console, f"... {line}")


PRECONDITION_EXIT = 3  # the alias was not as the command expected: nothing moved


def _handles_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn store errors into a single red line on stderr and exit code 1 (3: a failed precondition)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except StoreError as exc:
            Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {escape(str(exc))}")
            raise typer.Exit(code=PRECONDITION_EXIT if isinstance(exc, PreconditionFailed) else 1) from None

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


ForceOpt = Annotated[
    bool, typer.Option("--force", help="Move even if the evaluation gate refuses (needs --reason; history keeps both).")
]
ReasonOpt = Annotated[str | None, typer.Option("--reason", help="Why: kept in the alias history.")]
AllFiguresOpt = Annotated[
    bool, typer.Option("--all-figures", help="List every figure the gate compared, not only the failing ones.")
]
ExpectOpt = Annotated[
    str | None,
    typer.Option(
        "--expect",
        metavar="VERSION",
        help="Move only if the alias' primary is VERSION ('-': the alias points nowhere yet), checked with the "
        "write; else exit 3 and move nothing.",
    ),
]


def _name_and_version(store: ModelStore, ref: str, version: str | None, command: str) -> tuple[str, str]:
    """``name@version`` (or ``name@alias``) as one argument, or ``NAME VERSION`` as two."""
    if version is not None:
        if "@" in ref:
            raise StoreError(f"{command} takes name@version or NAME VERSION, not both")
        return store.resolve(f"{ref}@{version}")
    if "@" not in ref:
        raise StoreError(f"{command} needs name@version (or NAME VERSION), got {ref!r}")
    return store.resolve(ref)


@app.command()
@_handles_errors
def promote(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="name@version (or name@alias) to promote, or NAME when VERSION follows.")],
    version: Annotated[str | None, typer.Argument(help="The version, when REF is a bare model name.")] = None,
    alias: AliasOpt = DEFAULT_ALIAS,
    force: ForceOpt = False,
    reason: ReasonOpt = None,
    expect: ExpectOpt = None,
    all_figures: AllFiguresOpt = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Verify a version, run the evaluation gate against the alias' target, and point the alias at it
    (the old target is kept for rollback). Promoting a running canary's version ends it at 100 %."""
    store = _store(ctx, store_location)
    name, version = _name_and_version(store, ref, version, "promote")
    before = store.alias_entry(name, alias)
    out = _out()
    previous = store.promote(
        name, alias, version, force=force, reason=reason, expect=expect,
        on_gate=lambda report: print_gate(out, report, all_figures), on_step=_progress(),
    )  # fmt: skip
    ended = " (canary ended at 100 %)" if before is not None and before.canary is not None else ""
    out.print(f"{name}@{alias}: {previous or '-'} -> {version}{ended}")


@app.command()
@_handles_errors
def canary(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[str, typer.Argument(help="Version to send a share of the requests to.")],
    weight: Annotated[float, typer.Option("--weight", "-w", help="Percent of requests (0 < w < 100).")],
    alias: AliasOpt = DEFAULT_ALIAS,
    force: ForceOpt = False,
    reason: ReasonOpt = None,
    expect: ExpectOpt = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace a canary of another version already running on the alias.")
    ] = False,
    all_figures: AllFiguresOpt = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Start a canary (or change its weight): VERSION answers WEIGHT percent of the alias' requests,
    chosen by caller, beside its target. A canary of another version already running is refused
    (exit 3) unless --replace. End it with promote (100 %) or rollback (0 %)."""
    store = _store(ctx, store_location)
    out = _out()
    entry = store.canary(
        name, alias, version, weight, force=force, reason=reason, expect=expect, replace=replace,
        on_gate=lambda report: print_gate(out, report, all_figures), on_step=_progress(),
    )  # fmt: skip
    out.print(f"{name}@{alias}: {entry_text(entry)}")


@app.command()
@_handles_errors
def shadow(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[str | None, typer.Argument(help="Version to re-run sampled requests on.")] = None,
    alias: AliasOpt = DEFAULT_ALIAS,
    fraction: Annotated[
        float, typer.Option("--fraction", "-f", help="Share of requests re-run on the shadow (0 < f <= 1).")
    ] = 0.1,
    off: Annotated[bool, typer.Option("--off", help="Remove the alias' shadow.")] = False,
    reason: ReasonOpt = None,
    expect: ExpectOpt = None,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Set a shadow: a sample of the alias' requests is re-run on VERSION after being answered, to
    compare the two (its answers are never returned). --off removes it. Not gated."""
    if off == (version is not None):
        raise StoreError("shadow needs a VERSION, or --off to remove the shadow")
    store = _store(ctx, store_location)
    entry = store.shadow(
        name, alias, None if off else version, fraction, reason=reason, expect=expect, on_step=_progress()
    )
    _out().print(f"{name}@{alias}: {entry_text(entry)}" + ("" if entry.shadow else " (no shadow)"))


@app.command()
@_handles_errors
def rollback(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    alias: AliasOpt = DEFAULT_ALIAS,
    reason: ReasonOpt = None,
    expect: Annotated[
        str | None,
        typer.Option(
            "--expect",
            metavar="VERSION",
            help="Roll back only if VERSION is what the rollback takes out of service (the canary while one "
            "runs, else the primary); needed to roll back again right after a rollback. Else exit 3.",
        ),
    ] = None,
    break_lock: Annotated[
        bool,
        typer.Option(
            "--break-lock",
            help="Emergency: take the model's lock from its holder at once instead of waiting for its lease "
            "(S3; a local lock dies with its holder). A move the holder made meanwhile is never overwritten.",
        ),
    ] = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Return an alias to the version it pointed to before the last promotion; while a canary runs,
    end the canary at 0 % instead (the target answers everything again). Right after a rollback
    (two operators answering one incident), another is refused (exit 3) unless --expect names
    the version it would take out of service."""
    store = _store(ctx, store_location)
    before = store.alias_entry(name, alias)
    target = store.rollback(name, alias, reason=reason, expect=expect, break_lock=break_lock, on_step=_progress())
    if before is not None and before.canary is not None:
        _out().print(f"{name}@{alias}: canary {before.canary.version} ended at 0 % -> {target}")
    else:
        _out().print(f"{name}@{alias}: {before.version if before else '-'} -> {target}")


@app.command()
@_handles_errors
def history(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    alias: Annotated[str | None, typer.Option("--alias", "-a", help="Only this alias.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the log as JSON.")] = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Every recorded move of a model's aliases (oldest first): when, what, from, to, the split, the
    gate's verdict, the reason and who; then where each alias points now."""
    store = _store(ctx, store_location)
    log = store.alias_log(name, alias)
    out = _out()
    if as_json:
        data = {a: [e.model_dump(mode="json", by_alias=True) for e in events] for a, events in log.items()}
        out.print_json(json.dumps(data))
        return
    if not any(log.values()):
        out.print(f"no alias moves recorded for {name}" + (f"@{alias}" if alias else ""))
    else:
        out.print(history_table(log, name))
    for a, entry in sorted(store.alias_entries(name).items()):
        if alias is None or a == alias:
            out.print(f"{name}@{a}: {escape(entry_text(entry))}")


@app.command()
@_handles_errors
def gate(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    version: Annotated[str, typer.Argument(help="Candidate version.")],
    alias: AliasOpt = DEFAULT_ALIAS,
    all_figures: AllFiguresOpt = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Dry run of the evaluation gate: compare VERSION's eval.json with the alias' target's and print
    the verdict; exit 1 if a promotion would be refused. Nothing moves."""
    store = _store(ctx, store_location)
    report = store.gate(name, alias, version)
    print_gate(_out(), report, all_figures)
    if not report.passed:
        raise typer.Exit(code=1)


@app.command()
@_handles_errors
def policy(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    set_file: Annotated[
        Path | None, typer.Option("--set", help="JSON file to install as the model's gate policy (gate.json).")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the policy (back to the defaults).")] = False,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Show or set the evaluation gate's policy of a model (<name>/gate.json in the store):
    {"tolerance": {"figure or glob": 0.02}, "direction": {"figure or glob": "higher|lower|ignore"}}."""
    store = _store(ctx, store_location)
    if set_file is not None and clear:
        raise StoreError("--set and --clear exclude each other")
    if set_file is not None:
        try:
            store.set_gate_policy(name, GatePolicy.model_validate_json(set_file.read_bytes()))
        except OSError as exc:
            raise StoreError(f"cannot read {set_file}: {exc}") from None
        except ValidationError as exc:
            raise StoreError(f"{set_file} is not a gate policy: {exc.errors()[0]['msg']}") from None
    elif clear:
        store.set_gate_policy(name, None)
    _out().print_json(store.gate_policy(name).model_dump_json())


@app.command()
@_handles_errors
def gc(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name.")],
    keep: Annotated[int, typer.Option("--keep", min=0, help="Also keep the newest N versions.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print what would be removed.")] = False,
    staging_grace: Annotated[
        float,
        typer.Option(
            "--staging-grace",
            min=0,
            metavar="SECONDS",
            help="Remove staging dirs (left by killed or failed publishes) only once nothing was written to "
            "them for this long: a younger one may belong to a publish still running. 0 removes them all.",
        ),
    ] = STAGING_GRACE_S,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Remove versions no alias (or alias history) references, and stale staging dirs."""
    removed = _store(ctx, store_location).gc(name, keep_latest=keep, dry_run=dry_run, staging_grace_s=staging_grace)
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
    alias: Annotated[
        list[str] | None, typer.Option("--alias", "-a", help="Alias to point at it, through the evaluation gate.")
    ] = None,
    force: ForceOpt = False,
    reason: ReasonOpt = None,
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Publish every file under DIRECTORY as a new immutable version.

    A top-level manifest.json in DIRECTORY is skipped (publish writes its own), and
    a ``files`` table in the manifest JSON is ignored (it is recomputed). Each step is printed
    as it completes (staged, published, each alias moved), so the output of an interrupted run
    says what it left.
    """
    fields = _read_fields(manifest_json)
    if not directory.is_dir():
        raise StoreError(f"{directory} is not a directory")
    files = {
        path.relative_to(directory).as_posix(): path
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).as_posix() != MANIFEST_FILE
    }
    out = _out()
    # One line per step, written out at once: a killed run's output must show where it stopped.
    _store(ctx, store_location, must_exist=False).publish(
        name, files, fields, version=version, aliases=alias or (), on_step=lambda line: _print_flushed(out, line),
        on_gate=lambda report: print_gate(out, report), force=force, reason=reason,
    )  # fmt: skip


@app.command("copy")
@_handles_errors
def copy_cmd(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="The version to copy: name@version (or name@alias).")],
    target: Annotated[
        str, typer.Option("--as", metavar="NAME[@VERSION]", help="The copy: NAME@VERSION, or NAME for its next vN.")
    ],
    store_location: StoreOpt = DEFAULT_STORE,
) -> None:
    """Publish a byte copy of a version under another version (or model) name, with its eval.json:
    a candidate for rehearsing canary, promote and rollback. No alias moves."""
    store = _store(ctx, store_location)
    if "@" not in ref:
        raise StoreError(f"copy needs name@version (or name@alias), got {ref!r}")
    name, version = store.resolve(ref)
    to_name, to_version = parse_target(target)
    out = _out()
    manifest = store.copy(name, version, to_name, to_version, on_step=lambda line: _print_flushed(out, line))
    out.print(f"copied {name}@{version} -> {manifest.ref} (no alias moved)")


def _print_flushed(out: Console, line: str) -> None:
    try:
        out.print(escape(line))
        out.file.flush()
    except OSError:  # nobody reads the output any more (a closed pipe): the publish goes on all the same
        pass


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
