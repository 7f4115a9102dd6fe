"""What every command module shares: the consoles, the one way to stop with an error, shared help texts.

Command modules (``*/commands.py``) import this, never ``twotower.cli``: the CLI is the top floor.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

# Tables are wide: don't squeeze them to 80 columns when output goes to a file or pipe.
console = Console() if sys.stdout.isatty() else Console(width=160)
err_console = Console(stderr=True)

COMPILE_HELP = ("Encode documents through torch.compile (Inductor): faster per document after a one-off compile "
                "of 15-25 s on 2 cores (fp32 1.12x, bf16 1.04x: benchmarks/results/compile_speed.md); worth it "
                "from several thousand documents.")
DEVICE_HELP = "auto (the GPU where torch sees one, else cpu) | cpu | cuda | cuda:N"
BATCH_HELP = "Texts per encoding batch (default by device: 32 on CPU, 128 on CUDA; README, GPU)."
PRF_DEPTH_HELP = ("Dense pseudo-relevance feedback: move each query vector toward the mean of its top N documents' "
                  "vectors and search again (Rocchio; e.g. 3). Default: off.")
PRF_WEIGHT_HELP = "The feedback's share against the query's, above 0 (default 1: equal); needs --prf-depth."
LANGUAGE_HELP = ("BM25 text analysis: an ISO 639-1 code (en ar de el es hi ru tr … with Snowball stemmers; zh ja ko th: "
                 "character n-grams), multi (mixed languages) or auto (from the documents' script).")


def fail(exc: Exception | str) -> NoReturn:
    """Print ``error: <message>`` to stderr and exit with status 2 (no traceback)."""
    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
