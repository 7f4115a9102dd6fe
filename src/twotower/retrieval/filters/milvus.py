"""Translate to Milvus: a parsed filter as a Milvus boolean expression over the collection's JSON field, with
exactly the meaning :meth:`twotower.retrieval.filters.Filter.matches` gives it (:func:`to_milvus_expr`; where Milvus
cannot give it, the difference is named there and refused by
:func:`twotower.retrieval.milvus.filtering.milvus_filter`).

``$text`` (:mod:`twotower.retrieval.filters.text`) becomes ``text like "%phrase%"`` with ``%``, ``_`` and ``\\``
escaped, checked against Milvus Lite by the tests. Milvus' LIKE reads a backslash followed by a letter as an escape of
that letter, so a phrase holding a backslash is refused on a Milvus index (a :class:`~twotower.DataError`), never
answered differently.

``$not``: Milvus evaluates a condition on a missing JSON field (or on a value of another kind) as *unknown*, and
``not unknown`` is unknown, so ``not (metadata["lang"] == "en")`` would skip a document without ``lang`` where
``$not`` lets it through. A negated condition is therefore written as ``not (exists path) or not (condition)``
(``$exists`` alone is never unknown), and ``$not`` over ``$and`` / ``$or`` is pushed down to the conditions (De
Morgan). A negated range (``$gt``…) is exact only where the path holds values of the compared kind (or null, or
nothing): :func:`twotower.retrieval.milvus.filtering.milvus_filter` refuses it on a path that has held others.
"""

from __future__ import annotations

import json
from typing import Any

from twotower.errors import DataError
from twotower.retrieval.filters.columns import RANGES
from twotower.retrieval.filters.parse import And, Condition, Filter, Not, Text, parse_filter

TEXT_FIELD = "text"  # the Milvus collection's text field


def _fail(message: str, field: str, hint: str | None = None) -> DataError:
    return DataError("filter", message, field=field, hint=hint)


def text_expr(phrase: str, negated: bool = False) -> str:
    """``text like "%phrase%"`` (escaped), or its negation; a phrase with a backslash is refused (module docstring)."""
    if "\\" in phrase:
        raise DataError("filter", "a $text phrase holding a backslash cannot be matched exactly on a Milvus index "
                        "(Milvus' LIKE reads \\x as an escape)", field="$text.$contains",
                        hint="leave the backslash out of the phrase, or use the local backend")
    pattern = "%" + phrase.replace("%", "\\%").replace("_", "\\_") + "%"
    expr = f"{TEXT_FIELD} like {json.dumps(pattern, ensure_ascii=False)}"
    return f"not ({expr})" if negated else expr


def negated_expr(expr: str, op: str, target: str) -> str:
    """The negation of one condition's Milvus expression ``expr`` (on the JSON path ``target``), never unknown:
    ``$exists`` negates as is, every other operator also lets through the documents that lack the path."""
    if op == "$exists":
        return f"not ({expr})"
    return f"(not (exists {target}) or not ({expr}))"


_MILVUS_ESCAPES = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def milvus_string(text: str) -> str:
    """``text`` as a double-quoted Milvus string literal. Milvus's expression parser knows the escapes ``\\\\``,
    ``\\"``, ``\\n``, ``\\r`` and ``\\t`` only (``\\u0001``, ``\\x01``, ``\\b`` are "unknown escape sequences"),
    and takes every other character, control characters included, as it stands; so those five are escaped and the
    rest written raw. (A lone surrogate, which UTF-8 cannot carry, never gets here: parse_filter refuses it.)"""
    return '"' + text.translate(_MILVUS_ESCAPES) + '"'


def _milvus_literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return milvus_string(value)
    return repr(value)


def _milvus_path(field: str, path: tuple[str, ...]) -> str:
    return field + "".join(f"[{milvus_string(p)}]" for p in path)


def _milvus_condition(c: Condition, field: str) -> str:
    if c.op != "$exists" and any(v is None for v in (c.value if c.op in ("$in", "$nin") else (c.value,))):
        name = ".".join(c.path)
        raise _fail("Milvus cannot compare with null (it reads a JSON null as a missing field)", f"{name}.{c.op}",
                    f'test for a missing field with {{"{name}": {{"$exists": false}}}}')
    target = _milvus_path(field, c.path)
    exists = f"exists {target}"
    if c.op == "$exists":
        return exists if c.value else f"not ({exists})"
    values = c.value if c.op in ("$in", "$nin") else (c.value,)
    if c.op in ("$in", "$nin"):
        if not values:
            return "false" if c.op == "$in" else exists
    if c.op in RANGES:
        symbol = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[c.op]
        return f"{target} {symbol} {_milvus_literal(c.value)}"  # list fields: see to_milvus_expr
    lits = [_milvus_literal(v) for v in values]
    hit = "(" + " or ".join([f"{target} == {lit}" for lit in lits] + [f"json_contains_any({target}, [{', '.join(lits)}])"]) + ")"
    return hit if c.op in ("$eq", "$in") else f"({exists} and not {hit})"


def to_milvus_expr(flt: Filter | dict | None, field: str = "metadata") -> str:
    """The filter as a Milvus boolean expression over the JSON field ``field`` (strings escaped); ``""`` for the
    empty filter. Equality and ``$in`` test the field's value and, for a list, its elements (``json_contains_any``).
    Where Milvus (Lite 3.2, checked by ``tests/test_filters.py``) differs from :meth:`Filter.matches`: a range
    operator on a list-valued field (Milvus compares the field, not its elements); a boolean equals the numbers
    1 / 0 there (``{"ok": 1}`` finds ``"ok": true``); a field holding null counts as missing (``$exists``).
    Comparing with null is refused (a :class:`~twotower.DataError`): Milvus cannot express it. ``$not`` is pushed
    down to the conditions, each negated so that a missing field passes, and ``$text`` becomes ``text like``
    (module docstring). A Milvus index searches with
    :func:`twotower.retrieval.milvus.filtering.milvus_filter`, which refuses those differences where the
    collection's documents could meet them.

    Example::

        assert to_milvus_expr({"source": "wiki"}) == \\
            '(metadata["source"] == "wiki" or json_contains_any(metadata["source"], ["wiki"]))'
    """
    flt = parse_filter(flt)
    if flt.empty:
        return ""

    def walk(f: Filter, negated: bool = False) -> str:
        if isinstance(f, Condition):
            expr = _milvus_condition(f, field)
            return negated_expr(expr, f.op, _milvus_path(field, f.path)) if negated else expr
        if isinstance(f, Not):
            return walk(f.part, not negated)
        if isinstance(f, Text):
            return text_expr(f.phrase, negated)
        joiner = " and " if isinstance(f, And) != negated else " or "  # De Morgan under $not
        return "(" + joiner.join(walk(p, negated) for p in f.parts) + ")"

    return walk(flt)


__all__ = ["TEXT_FIELD", "milvus_string", "negated_expr", "text_expr", "to_milvus_expr"]
