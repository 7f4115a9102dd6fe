"""What every command module shares: the consoles, the one way to stop with an error, shared help texts.

The CLI's alone: library code never prints (it logs and raises), so nothing outside :mod:`twotower.cli` imports this.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

# C0 controls but tab and newline, DEL and C1 controls (ESC starts terminal escape sequences; NUL, CR and
# backspace hide or rewrite what was printed), and lone surrogates (not encodable: the write would fail).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape_char(match: re.Match) -> str:
    ch = match.group()
    return ch.encode("utf-8", "backslashreplace").decode("ascii") if "\ud800" <= ch <= "\udfff" else repr(ch)[1:-1]


def literal(text: object) -> str:
    """``str(text)`` as it should reach a terminal: control characters and lone surrogates written as Python
    escapes (``\\x00``, ``\\x1b``, ``\\udcff``), everything else (brackets, ``:emoji:`` codes) unchanged."""
    return _UNPRINTABLE.sub(_escape_char, str(text))


class LiteralConsole(Console):
    """A rich Console that prints every string literally: no markup (``[/i]`` in a title is text, not a closing
    tag), no ``:emoji:`` codes, and control characters and lone surrogates escaped (see :func:`literal`).

    Every ``str`` rich renders -- ``print`` arguments, table cells, column headers and titles, rules -- passes
    through :meth:`render_str`, so user text (paths, ids, titles, retriever names) needs no escaping at each
    call site. Styling is done with :class:`rich.text.Text` objects, as :func:`fail` and :func:`warn` do.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(markup=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs) -> Text:
        kwargs["markup"] = kwargs["emoji"] = False
        return super().render_str(literal(text), **kwargs)


# Tables are wide: don't squeeze them to 80 columns when output goes to a file or pipe.
console = LiteralConsole() if sys.stdout.isatty() else LiteralConsole(width=160)
err_console = LiteralConsole(stderr=True)

COMPILE_HELP = ("Encode documents through torch.compile (Inductor): faster per document after a one-off compile "
                "of 15-25 s on 2 cores (fp32 1.12x, bf16 1.04x: benchmarks/results/compile_speed.md); worth it "
                "from several thousand documents.")
DEVICE_HELP = "auto (the GPU where torch sees one, else cpu) | cpu | cuda | cuda:N"
BATCH_HELP = "Texts per encoding batch (default by device: 32 on CPU, 128 on CUDA; README, GPU)."
PRF_DEPTH_HELP = ("Dense pseudo-relevance feedback: move each query vector toward the mean of its top N documents' "
                  "vectors and search again (Rocchio; e.g. 3). Default: off.")
PRF_WEIGHT_HELP = "The feedback's share against the query's, above 0 (default 1: equal); needs --prf-depth."
RUNTIME_HELP = ("What encodes on a CPU: auto (per CPU: int8 where it keeps cosine >= 0.99 on the texts, else the "
                "fastest fp32 / bf16; docs/guides/cpu-runtimes.md) | torch | onnx | openvino | onnx-int8 | "
                "openvino-int8.")
LANGUAGE_HELP = ("BM25 text analysis: an ISO 639-1 code (en ar de el es hi ru tr … with Snowball stemmers; zh ja ko th: "
                 "character n-grams), multi (mixed languages) or auto (from the documents' script).")


def fail(exc: Exception | str) -> NoReturn:
    """Print ``error: <message>`` to stderr and exit with status 2 (no traceback)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", literal(exc)), highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def warn(message: str) -> None:
    err_console.print(Text.assemble(("warning:", "yellow"), " ", literal(message)), highlight=False, soft_wrap=True)
