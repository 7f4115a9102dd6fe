"""One exception hierarchy at the API's edge: the library's checks that raise ``ValueError`` (a bad option value)
reach the caller as :class:`~twotower.TwoTowerError`, the class every public function documents."""

from __future__ import annotations

import functools

from twotower.errors import TwoTowerError


def user_errors(fn):
    """``fn`` with a ``ValueError`` raised inside turned into a ``TwoTowerError`` carrying the same message."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TwoTowerError:
            raise
        except ValueError as exc:
            raise TwoTowerError(str(exc)) from exc

    return wrapper
