"""What the commands need from the library beyond the public API: the checks a command runs before any loading
(output paths, the service's options and port), so that a bad option fails at once and is named as a flag, and
finding a data set's folder (``twotower data locate``).

This is the CLI's one module that imports library modules other than ``twotower`` itself (tests/test_cli_thin.py
lists the ones it may import); the command modules import these helpers, never the library's internals. The
imports stay inside the functions: ``twotower --help`` loads none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

from twotower.errors import TwoTowerError


def check_output_file(path: Path | None, option: str) -> None:
    """``option`` (e.g. ``"--out"``) can be written as a file at ``path``: nothing there, or a regular writable
    file (a directory, link, FIFO, device or socket is refused, never replaced). None: no check."""
    from twotower.io import check_output_file as check

    check(path, option)


def check_outputs(*outputs: tuple[str, Path | None], data: Path | None = None) -> None:
    """:func:`check_output_file` for each ``(option, path)`` pair, refusing two options that name one file and
    (given ``data``, a BEIR folder) an output that is one of the data set's own files."""
    from twotower.io import check_not_inputs, check_output_files

    check_output_files(*outputs)
    if data is not None:
        from twotower.data.beir import beir_files

        check_not_inputs(outputs, beir_files(data))


def check_output_dir(path: Path | None, option: str, *, replaced: bool = False) -> None:
    """``option`` can name an output folder at ``path``: nothing there (its parent can be created) or a directory
    that takes new files; ``replaced=True`` for a folder written whole (a link there is refused)."""
    from twotower.io import check_output_dir as check

    check(path, option, replaced=replaced)


def check_serve_options(*, precision: str, query_runtime: str) -> None:
    """``twotower serve``'s option values, before the port, the index or the model is touched (``tt.create_app``
    checks them too, but only after the port)."""
    from twotower.serve.app import check_options

    check_options(precision=precision, query_runtime=query_runtime)


def check_port(host: str, port: int) -> None:
    """A server can listen on ``host:port`` (``--host``, ``--port``), checked before anything is loaded or announced."""
    from twotower.serve.port import check_port as check

    check(host, port)  # under the CLI's names: --host, --port


def locate_beir(path: Path, cache: Path) -> Path:
    """A usable BEIR folder: ``path`` itself when it is one, else the cached (or downloaded) copy of the data set
    its last part names."""
    from twotower.data.fetch import resolve_data

    return resolve_data(path, cache)


FILTER_FILE_MAX_BYTES = 1024 * 1024  # a filter file: at most 1 MiB (a filter holds at most 1,024 conditions)


def read_filter_file(path: Path, option: str = "--filter") -> str:
    """The text of a filter given as ``@FILE``: a regular file (never a FIFO, nor a device such as /dev/zero, which
    would block or fill memory) of at most :data:`FILTER_FILE_MAX_BYTES`, UTF-8 with or without a byte-order mark;
    anything else a TwoTowerError naming ``option`` and the file."""
    from twotower.io import read_input_text

    return read_input_text(path, option, limit=FILTER_FILE_MAX_BYTES, what="filter file")


def read_json_option(text: str, option: str):
    """``text`` (a JSON option's value) decoded; a :class:`TwoTowerError` naming ``option`` for text that is not
    JSON, nests deeper than Python's JSON reader goes (no traceback), or holds a whole number of more than 4,300
    digits (not Python's advice on ``sys.set_int_max_str_digits``)."""
    from twotower.data.metadata import MAX_DEPTH, MAX_INT

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TwoTowerError(f"{option}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TwoTowerError(f"{option}: nested too deep to read (metadata nests at most {MAX_DEPTH} levels of "
                            "objects and lists): flatten it") from None
    except ValueError:  # Python's limit on the digits of a whole number
        raise TwoTowerError(f"{option}: holds a number of more than 4,300 digits (a metadata number is at most "
                            f"±{MAX_INT:,}, 2**53): give a smaller one, or the number as a string") from None
