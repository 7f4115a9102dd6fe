"""Parse and validate: a metadata filter (a dict, or its JSON text) checked and built once into a tree of
:class:`Filter` nodes (:class:`Condition`, :class:`And`, :class:`Or`, :class:`Not`, :class:`Text`), each with the
reference evaluation over one document (:meth:`Filter.matches`) and the vectorised one over a version's columns
(:meth:`Filter.mask`, :mod:`twotower.retrieval.filters.columns`). The language and its exact meaning:
:mod:`twotower.retrieval.filters`. :func:`parse_filter` hands a parsed :class:`Filter` back as it is, so the
layers behind the door that parsed it take it without parsing again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from twotower.data.metadata import kind
from twotower.errors import DataError
from twotower.retrieval.filters.checks import check_filter, load_filter_text
from twotower.retrieval.filters.columns import RANGES, MetadataColumns
from twotower.retrieval.filters.text import text_phrase


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
    check_filter(obj)  # the limits, and what no backend takes: before any work (filters.checks)
    return _parse(obj, "filter")


__all__ = ["COMPARISONS", "LOGICAL", "And", "Condition", "Filter", "Not", "Or", "Text", "parse_filter"]
