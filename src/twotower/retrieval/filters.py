"""Metadata filters: the language LangChain, Chroma and Milvus users write, with one exact meaning.

A filter is a JSON object over a document's metadata (:mod:`twotower.data.metadata`)::

    {"source": "wiki"}                                   equality
    {"source": "wiki", "year": {"$gte": 2020}}           several keys: all must hold (AND)
    {"$or": [{"lang": "en"}, {"lang": {"$in": ["de", "fr"]}}]}
    {"author.name": {"$ne": "Ann"}}                      a dotted path into nested objects

Operators: ``$eq $ne $gt $gte $lt $lte $in $nin $exists`` on a field; ``$and`` / ``$or`` over a non-empty list of
filters; ``$not`` over one filter (the documents it does not let through, missing fields included: see
:mod:`twotower.retrieval.filter_ops`); ``{"$text": {"$contains": "phrase"}}`` on the document's text (an exact,
case-sensitive substring of the text, not of the title). A field may take several operators at once
(``{"$gte": 1, "$lt": 5}``: all hold). ``None`` or ``{}`` is no filter (every document matches).

The exact semantics (the same in :meth:`Filter.matches`, in :meth:`Filter.mask` and in every search mode):

- **Kinds.** A value is a string, a number (int or float: ``1 == 1.0``), a boolean, null, a list or an object.
  Booleans are not numbers (``True`` does not equal ``1``). Two values are equal only when they are of the same kind
  and equal. ``$gt $gte $lt $lte`` compare numbers with numbers and strings with strings (by Unicode code point, as
  Python and UTF-8 byte order do); a field of another kind does not match (``{"title_len": {"$gt": 3}}`` skips a
  document whose ``title_len`` is the string ``"long"``) — no error, since metadata differ from document to document.
- **Missing fields.** A document without the field matches no condition on it except ``{"$exists": false}``; that
  includes ``$ne`` and ``$nin`` (``{"lang": {"$ne": "en"}}`` needs a ``lang``). A field holding null exists.
- **Lists** (tags): a field holding a list matches ``$eq`` / ``$in`` / ``$gt`` … when *any* element does, and
  ``$ne`` / ``$nin`` when *no* element equals the value(s). ``{"tags": "tea"}`` finds ``{"tags": ["tea", "green"]}``.
- **Objects**: a field holding an object equals no value (filter inside it with a dotted path); ``$ne`` / ``$nin``
  match it. A path does not step into lists (``a.b`` where ``a`` is a list: missing). A key that itself contains a
  dot cannot be filtered on.
- ``$in: []`` matches nothing; ``$nin: []`` matches every document that has the field.

Errors (a :class:`~twotower.DataError` whose ``field`` names the offending path or operator): a filter that is not an
object, an unknown operator, ``$in`` / ``$nin`` without a list, ``$and`` / ``$or`` without a non-empty list of
objects, ``$exists`` without a boolean, a range operator with anything but a number or a string (booleans
included), a comparison with a list or an object, a number that is not finite, an empty path segment; and, checked
first, before anything is built (:mod:`twotower.retrieval.filter_checks`): more than 32 levels of ``$and`` /
``$or``, 1,024 conditions or 4,096 ``$in`` / ``$nin`` values, a number beyond float range, a lone surrogate, a
comparison with null (the one rule on every backend: Milvus cannot tell a null from a missing field).

:func:`parse_filter` validates a filter once; :meth:`Filter.matches` is the reference evaluation over one metadata
dict; :meth:`Filter.mask` evaluates it over a whole index version at once (a boolean array, one entry per document
row, from :class:`~twotower.retrieval.filter_columns.MetadataColumns` built once per version);
:func:`to_milvus_expr` writes the same filter as a Milvus boolean expression over a JSON field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from twotower.data.metadata import kind
from twotower.errors import DataError
from twotower.retrieval.filter_checks import check_filter, load_filter_text
from twotower.retrieval.filter_columns import RANGES, MetadataColumns
from twotower.retrieval.filter_ops import negated_expr, text_expr, text_phrase


COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")
LOGICAL = ("$and", "$or")
_MISSING = object()


def _fail(message: str, field: str, hint: str | None = None) -> DataError:
    return DataError("filter", message, field=field, hint=hint)


def _equal(a: Any, b: Any) -> bool:
    return kind(a) == kind(b) and a == b


def _compare(op: str, a: Any, b: Any) -> bool:
    if kind(a) != kind(b):
        return False
    return bool(RANGES[op](a, b))


@dataclass(frozen=True)
class Filter:
    """A validated metadata filter (build one with :func:`parse_filter`).

    Example::

        f = tt.parse_filter({"type": "tea", "year": {"$gte": 2020}})
        assert f.matches({"type": "tea", "year": 2021}) and not f.matches({"type": "tea"})
    """

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        """Whether one document's metadata (and ``text``, for a ``$text`` filter) passes (the reference the
        vectorised :meth:`mask` is tested against)."""
        raise NotImplementedError

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        """A boolean array, one entry per document row of ``columns``: True where the document passes."""
        raise NotImplementedError

    @property
    def empty(self) -> bool:
        """True for a filter that lets every document through by its form, whatever the documents hold: ``None``,
        ``{}``, an ``$and`` of such filters, an ``$or`` holding one (a write refuses it without an explicit
        "all")."""
        return False


@dataclass(frozen=True)
class Condition(Filter):
    """One operator on one field: ``path`` (the dotted path split), ``op`` (``$eq`` …), ``value``."""

    path: tuple[str, ...]
    op: str
    value: Any

    def resolve(self, metadata: dict) -> Any:
        node: Any = metadata
        for part in self.path:
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        value = self.resolve(metadata)
        if self.op == "$exists":
            return (value is not _MISSING) == self.value
        if value is _MISSING:
            return False
        elements = list(value) if isinstance(value, (list, tuple)) else [value]
        if self.op in ("$eq", "$ne"):
            hit = any(_equal(e, self.value) for e in elements)
            return hit if self.op == "$eq" else not hit
        if self.op in ("$in", "$nin"):
            hit = any(_equal(e, v) for e in elements for v in self.value)
            return hit if self.op == "$in" else not hit
        return any(_compare(self.op, e, self.value) for e in elements)

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        return columns.condition(self.path, self.op, self.value)


@dataclass(frozen=True)
class And(Filter):
    """All of ``parts`` hold (``$and``, or several keys in one object; no parts: every document)."""

    parts: tuple[Filter, ...]

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        return all(p.matches(metadata, text) for p in self.parts)

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        out = np.ones(columns.num_docs, dtype=bool)
        for part in self.parts:
            out &= part.mask(columns)
        return out

    @property
    def empty(self) -> bool:
        return all(p.empty for p in self.parts)  # no parts, or parts that each let everything through


@dataclass(frozen=True)
class Or(Filter):
    """At least one of ``parts`` holds (``$or``)."""

    parts: tuple[Filter, ...]

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        return any(p.matches(metadata, text) for p in self.parts)

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        out = np.zeros(columns.num_docs, dtype=bool)
        for part in self.parts:
            out |= part.mask(columns)
        return out

    @property
    def empty(self) -> bool:
        return any(p.empty for p in self.parts)  # one part that lets everything through: so does the $or


@dataclass(frozen=True)
class Not(Filter):
    """The documents ``part`` does not let through (``{"$not": {...}}``): a document that lacks a field ``part``
    tests passes (unlike ``$ne``)."""

    part: Filter

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        return not self.part.matches(metadata, text)

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        return ~self.part.mask(columns)


@dataclass(frozen=True)
class Text(Filter):
    """The document's text holds ``phrase`` (``{"$text": {"$contains": phrase}}``): an exact, case-sensitive
    substring of the text (the title and the metadata are not searched)."""

    phrase: str

    def matches(self, metadata: dict, text: str | None = None) -> bool:
        if text is None:
            raise _fail("a $text filter needs the document's text; pass matches(metadata, text)", "$text")
        return self.phrase in text

    def mask(self, columns: "MetadataColumns") -> np.ndarray:
        return columns.contains(self.phrase)


def _parse_not(value: Any, parse) -> Filter:
    if not isinstance(value, dict) or not value:
        raise _fail(f"$not takes one non-empty filter object, got {json.dumps(value, default=str)[:60]}", "$not",
                    '{"$not": {"kind": "tea"}}')
    return Not(parse(value, "$not"))


def _scalar(value: Any, field: str) -> Any:
    k = kind(value)
    if k in ("list", "object"):
        raise _fail(f"compares with {'a list' if k == 'list' else 'an object'} ({json.dumps(value, default=str)[:60]})",
                    field,
                    "compare with one value; $in takes a list of values; dotted paths reach into objects")
    if k not in ("null", "bool", "number", "string"):
        raise _fail(f"value of type {type(value).__name__} is not JSON", field)
    if k == "number" and not math.isfinite(value):
        raise _fail(f"number {value} is not finite", field, "give a finite number")
    return value


def _condition(path: tuple[str, ...], op: str, value: Any, name: str) -> Condition:
    where = f"{name}.{op}"
    if op == "$exists":
        if not isinstance(value, bool):
            raise _fail(f"$exists takes true or false, got {value!r}", where)
    elif op in ("$in", "$nin"):
        if not isinstance(value, (list, tuple)):
            raise _fail(f"{op} takes a list of values, got {type(value).__name__} {value!r}"[:160], where,
                        f'e.g. {{"{name}": {{"{op}": ["a", "b"]}}}}')
        value = tuple(_scalar(v, f"{where}[{i}]") for i, v in enumerate(value))
    elif op in RANGES:
        if kind(value) not in ("number", "string"):
            raise _fail(f"{op} compares with a number or a string, got {json.dumps(value, default=str)[:60]}", where,
                        "booleans and null have no order; use $eq / $ne")
        value = _scalar(value, where)
    else:
        value = _scalar(value, where)
    return Condition(path, op, value)


def _field(name: str, spec: Any) -> Filter:
    if name.startswith("$"):
        known = ", ".join(LOGICAL + ("$not", "$text"))
        raise _fail(f"unknown operator {name!r} where a field name or one of {known} belongs", name,
                    f"field operators ({', '.join(COMPARISONS)}) go inside a field: {{\"field\": {{\"$gt\": 1}}}}")
    path = tuple(name.split("."))
    if not all(path):
        raise _fail(f"field path {name!r} has an empty segment", name, "write a.b.c, without leading, trailing or "
                    "doubled dots")
    if not isinstance(spec, dict):
        return _condition(path, "$eq", spec, name)
    if not spec:
        raise _fail("an empty object: give a value or operators", name, f'e.g. {{"{name}": {{"$eq": "x"}}}}')
    parts = []
    for op, value in spec.items():
        if not isinstance(op, str) or not op.startswith("$"):
            raise _fail(f"{op!r} is not an operator (equality with an object is not supported)", f"{name}.{op}",
                        f"reach into nested objects with a dotted path: {name}.{op}")
        if op not in COMPARISONS:
            raise _fail(f"unknown operator {op!r}", f"{name}.{op}", f"choose one of {', '.join(COMPARISONS)}")
        parts.append(_condition(path, op, value, name))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _parse(obj: Any, where: str) -> Filter:
    if not isinstance(obj, dict):
        raise _fail(f"a filter is a JSON object, got {type(obj).__name__}", where,
                    'e.g. {"source": "wiki", "year": {"$gte": 2020}}')
    parts: list[Filter] = []
    for key, value in obj.items():
        if not isinstance(key, str):
            raise _fail(f"key {key!r} is not a string", where)
        if key in ("$not", "$text"):
            parts.append(_parse_not(value, _parse) if key == "$not" else Text(text_phrase(value)))
        elif key in LOGICAL:
            if not isinstance(value, (list, tuple)) or not value:
                raise _fail(f"{key} takes a non-empty list of filters, got {json.dumps(value, default=str)[:60]}",
                            key, f'e.g. {{"{key}": [{{"a": 1}}, {{"b": 2}}]}}')
            subs = tuple(_parse(v, f"{key}[{i}]") for i, v in enumerate(value))
            parts.append(And(subs) if key == "$and" else Or(subs))
        else:
            parts.append(_field(key, value))
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def parse_filter(obj: Any) -> Filter:
    """Validate a metadata filter (a dict, or its JSON text) and return it as a :class:`Filter`; ``None`` and ``{}``
    give the filter every document passes. Errors are :class:`~twotower.DataError` naming the field or operator.

    Example::

        import twotower as tt

        f = tt.parse_filter({"$or": [{"tags": "tea"}, {"year": {"$lt": 2000}}]})
        assert f.matches({"tags": ["green", "tea"]}) and not f.matches({"year": "1999"})
    """
    if isinstance(obj, Filter):
        return obj
    if obj is None:
        return And(())
    if isinstance(obj, str):
        obj = load_filter_text(obj)
    check_filter(obj)  # the limits, and what no backend takes: before any work (retrieval.filter_checks)
    return _parse(obj, "filter")


# ---------------------------------------------------------------------------------------------- Milvus


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
    (:mod:`twotower.retrieval.filter_ops`). A Milvus index searches with
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
