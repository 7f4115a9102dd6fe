"""One validation layer for the numbers a caller gives (counts, sizes, rates, weights), shared by the Python API,
the CLI, TOML configs and the service.

A number is checked where the library takes it, before any work, by :func:`check_number`: a real number (not a
string, not a bool), finite, a whole number where a count is meant, inside the bounds the message states. The
message names the parameter as the caller knows it: ``epochs=`` from Python, ``--epochs`` from the command line
(the CLI runs its commands under :func:`cli_names`), so one check serves both. Ids have their own one rule in
:mod:`twotower.data.ids`.

Example::

    from twotower.checks import check_number

    epochs = check_number(4, "epochs", above=0)  # 4; float("inf") or "4" would raise, naming epochs=
"""

from __future__ import annotations

import math
import os
import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from twotower.errors import TwoTowerError

# the largest whole number any count may be unless a call states its own bound: past it numpy and torch overflow
# (int32 indices, C longs) with errors that name no parameter
MAX_COUNT = 2**31 - 1

# how the caller names parameters: "python" (epochs=), "cli" (--epochs) or "toml" (epochs, a key of a stages file)
_CLI: ContextVar[str] = ContextVar("twotower_names", default="python")


@contextmanager
def cli_names(style: str = "cli") -> Iterator[None]:
    """Within this block, messages name parameters as command-line options (``--top-k``), not ``k=`` (``style``
    ``"toml"``: as keys of a TOML file, ``lr = ...``)."""
    token = _CLI.set(style)
    try:
        yield
    finally:
        _CLI.reset(token)


def use_cli_names() -> object:
    """Switch to command-line names until :func:`reset_names` is given the returned token (the CLI's callback)."""
    return _CLI.set("cli")


def reset_names(token) -> None:
    _CLI.reset(token)


def naming() -> str:
    """How messages name parameters now: ``"python"``, ``"cli"`` (under :func:`cli_names`) or ``"toml"``; for a
    message whose whole wording differs between the surfaces (a list written ``8,8`` or ``[8, 8]``)."""
    return _CLI.get()


def option_name(name: str, option: str | None = None) -> str:
    """How the caller knows the parameter ``name`` (a Python keyword, e.g. ``"batch_size"``): ``--batch-size`` under
    the CLI (``option`` when its flag is spelt otherwise, e.g. ``--top-k`` for ``k``), else ``batch_size=``."""
    style = _CLI.get()
    if style == "cli":
        return option or "--" + name.replace("_", "-")
    return f"{name} =" if style == "toml" else f"{name}="


def flag(name: str, option: str | None = None) -> str:
    """:func:`option_name` without its ``=``, for lists of names and "drop X": ``out`` in Python, ``--out``."""
    return option_name(name, option).rstrip(" =")


def switch(name: str, option: str | None = None) -> str:
    """A True/False parameter turned on: ``replace=True`` in Python, ``--replace`` on the command line."""
    style = _CLI.get()
    if style == "cli":
        return option_name(name, option)
    return f"{name} = true" if style == "toml" else f"{name}=True"


def given(name: str, value, option: str | None = None) -> str:
    """A parameter with its value as the caller wrote it: ``num_negatives=3`` in Python, ``--num-negatives 3``; a
    list as ``matryoshka=[384, 192]`` in Python, ``--matryoshka 384,192`` on the command line."""
    where = option_name(name, option)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, (list, tuple)) and _CLI.get() == "cli":  # a list option: comma-separated, as typed there
        shown = ",".join(str(v) for v in value)
    elif isinstance(value, str) and len(value) <= 240:  # a choice or a path, whole: quoted in Python, bare on the CLI
        shown = repr(value) if where.endswith("=") else value
    else:
        shown = _show(value)
    return f"{where}{shown}" if where.endswith("=") and not where.endswith(" =") else f"{where} {shown}"


def _bounds(integer: bool, minimum, maximum, above, below) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"at least {minimum}")
    if above is not None:
        parts.append(f"above {above}")
    if maximum is not None:
        parts.append(f"at most {maximum}")
    if below is not None:
        parts.append(f"below {below}")
    what = "a whole number" if integer else "a finite number"
    return what + (" " + " and ".join(parts) if parts else "")


def check_number(value, name: str, *, integer: bool = False, minimum=None, maximum=None, above=None, below=None,
                 optional: bool = False, option: str | None = None, hint: str = "", where: str = ""):
    """``value`` when it is a number the parameter ``name`` can take, else a :class:`TwoTowerError` naming the
    parameter (see :func:`option_name`), the value and the bounds: finite; a whole number when ``integer`` (then at
    most :data:`MAX_COUNT` unless ``maximum`` says otherwise); ``minimum``/``maximum`` inclusive, ``above``/``below``
    exclusive. ``optional``: None passes. ``where`` prefixes the message (e.g. ``"stage 'finetune': "``). A bool is no number; numpy scalars are numbers (returned as Python ones).

    Example::

        check_number(32, "batch_size", integer=True, minimum=1)  # 32
    """
    if value is None and optional:
        return None
    if integer and maximum is None:
        maximum = MAX_COUNT
    rule = _bounds(integer, minimum, maximum, above, below)
    where = where + option_name(name, option)
    sep = " " if not where.endswith("=") or where.endswith(" =") else ""
    tail = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        kind = "nothing" if value is None else f"a {type(value).__name__}"
        raise TwoTowerError(f"{where}{sep}{_show(value)}: {rule} is needed, not {kind}{tail}")
    if integer:
        if not isinstance(value, numbers.Integral):
            whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
            if not whole:
                raise TwoTowerError(f"{where}{sep}{_show(value)}: {rule}{tail}")
        value = int(value)
    else:
        value = float(value) if not isinstance(value, numbers.Integral) else int(value)
        if not math.isfinite(value):
            raise TwoTowerError(f"{where}{sep}{_show(value)}: {rule}{tail}")
    if ((minimum is not None and value < minimum) or (maximum is not None and value > maximum)
            or (above is not None and not value > above) or (below is not None and not value < below)):
        raise TwoTowerError(f"{where}{sep}{_show(value)}: {rule}{tail}")
    return value


def _show(value) -> str:
    """``value`` for a message, a huge number cut short (a 5,000-digit ``k`` is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value) if isinstance(value, str) or value is None else str(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def check_bool(value, name: str, *, optional: bool = False, option: str | None = None, where: str = "") -> bool | None:
    """``value`` as a Python bool when it is one (numpy's ``bool_`` too), else a :class:`TwoTowerError` naming the
    parameter: a string such as ``"no"``, a number such as ``0`` or a list would otherwise be taken for its truth
    value (``"no"`` for True). ``optional``: None passes.

    Example::

        check_bool(False, "merge")  # False; "no" or 0 would raise, naming merge
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        return bool(value)
    kind = "nothing" if value is None else f"a {type(value).__name__}"
    raise TwoTowerError(f"{where}{flag(name, option)}: True or False is needed, not {kind} ({_show(value)})")


def check_numbers(values, name: str, **rules) -> tuple:
    """:func:`check_number` on each of ``values`` (a list or tuple parameter), naming ``name`` and the position."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TwoTowerError(f"{option_name(name)} {_show(values)}: a list of numbers is needed")
    return tuple(check_number(v, name, **rules) for v in values)
