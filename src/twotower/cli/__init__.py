"""The ``twotower`` command line: parse arguments, call the public API (``import twotower as tt``), print.

One module per command group, each adding its commands to :data:`app` with ``register(app)``; a command module
imports from the library only names of ``twotower.__all__`` (tests/test_cli_thin.py), and what the CLI needs
beyond them comes through :mod:`twotower.cli.helpers`. Heavy imports stay inside the commands, so ``--help`` is
fast. No library module imports this package (tests/test_import_graph.py: the CLI is the top floor).
"""

from __future__ import annotations

import logging
import os

# Nothing is fetched from a hub unless the user asks for it (HF_HUB_OFFLINE=0).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import typer

app = typer.Typer(help="Train, index, evaluate and serve dual-encoder retrievers.", no_args_is_help=True)


@app.callback()
def main(ctx: typer.Context,
         verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages.")) -> None:
    from twotower.checks import reset_names, use_cli_names

    token = use_cli_names()  # the library's messages name options as flags (--epochs, not epochs=)
    ctx.call_on_close(lambda: reset_names(token))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


from twotower.cli import analyze, datasets, evaluate, fit, index, models, pretrain, search, serve, train  # noqa: E402

# in this order in --help: the commands (eval, table, train, mine, train-reranker, pretrain, fit, search, serve),
# then the groups (data, models, index, analyze)
COMMAND_MODULES = (evaluate, datasets, models, train, pretrain, fit, index, search, serve, analyze)
for _module in COMMAND_MODULES:
    _module.register(app)
