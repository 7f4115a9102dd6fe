"""One exception hierarchy at the API's edge: the library's checks that raise ``ValueError`` (a bad option value)
reach the caller as :class:`~twotower.TwoTowerError`, the class every public function documents; and every
parameter a public function annotates ``bool`` is checked to be one (:func:`twotower.checks.check_bool`), so that
``merge="no"`` or ``documents=0`` is refused, not taken for its truth value."""

from __future__ import annotations

import functools
import inspect

from twotower.errors import TwoTowerError

_BOOL = ("bool", "<class 'bool'>")
_OPTIONAL_BOOL = ("bool | None", "None | bool", "Optional[bool]", "typing.Optional[bool]")


def bool_parameters(fn) -> tuple[dict[str, tuple[int | None, bool]], bool]:
    """``({name: (position or None when keyword-only, None allowed)}, whether **kwargs is taken)`` for the
    parameters of ``fn`` annotated ``bool`` or ``bool | None``."""
    found: dict[str, tuple[int | None, bool]] = {}
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        text = p.annotation if isinstance(p.annotation, str) else str(p.annotation)
        if text in _BOOL or text in _OPTIONAL_BOOL:
            positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            found[p.name] = (i if positional else None, text in _OPTIONAL_BOOL or p.default is None)
    return found, any(p.kind is p.VAR_KEYWORD for p in params)


def _check_flags(flags: dict, args: tuple, kwargs: dict) -> None:
    from twotower.checks import check_bool

    for name, (position, optional) in flags.items():
        if name in kwargs:
            check_bool(kwargs[name], name, optional=optional)
        elif position is not None and position < len(args):
            check_bool(args[position], name, optional=optional)


def user_errors(fn):
    """``fn`` with a ``ValueError`` raised inside turned into a ``TwoTowerError`` carrying the same message, and its
    ``bool`` parameters checked before it runs."""
    flags, _ = bool_parameters(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            if flags:
                _check_flags(flags, args, kwargs)
            return fn(*args, **kwargs)
        except TwoTowerError:
            raise
        except ValueError as exc:
            raise TwoTowerError(str(exc)) from exc

    return wrapper
