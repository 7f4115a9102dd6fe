"""``twotower data fetch|locate``: find or download BEIR data sets."""

from __future__ import annotations

from pathlib import Path

import typer

import twotower as tt
from twotower.cli.console import console, fail
from twotower.cli.helpers import locate_beir
from twotower.errors import TwoTowerError

data_app = typer.Typer(help="Find or download BEIR data sets.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")


@data_app.command("fetch")
def data_fetch(
    name: str = typer.Argument("scifact", help="BEIR data set name."),
    cache: Path = typer.Option(Path(".cache/data"), help="Folder to download into."),
) -> None:
    """Download a BEIR data set (checksum verified) and print its directory."""
    try:
        console.print(str(tt.fetch_beir(name, cache)), highlight=False, soft_wrap=True)
    except TwoTowerError as exc:
        fail(exc)


@data_app.command("locate")
def data_locate(
    path: Path = typer.Argument(..., help="A BEIR directory; if missing, the data set named by its last part is fetched."),
    cache: Path = typer.Option(Path(".cache/data"), help="Folder to download into."),
) -> None:
    """Print a usable data directory: PATH itself, or the cached/downloaded copy of its data set."""
    try:
        console.print(str(locate_beir(path, cache)), highlight=False, soft_wrap=True)
    except TwoTowerError as exc:
        fail(exc)
