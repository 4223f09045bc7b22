"""The installed distribution's version, for every command line's --version."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "clip-difference-service"


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"


def print_version(value: bool) -> None:
    """A typer callback for an eager ``--version`` option: print the version and exit."""
    import typer  # here, not above: ``python -m service --help`` reads the version and should not load typer

    if value:
        typer.echo(package_version())
        raise typer.Exit()
