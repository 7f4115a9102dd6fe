"""Columnar metadata of one index version, for evaluating filters with numpy instead of per document in Python.

Built once per opened version (:func:`columns_of` caches it on the store) from the metadata in ``docs.jsonl``.
Every path into the metadata's nested objects gets:

- ``present``: a boolean array, one entry per document row (the path exists, whatever its value);
- an *element table* per kind: the ``(row, value)`` pairs of the scalar values found at the path, a list's scalar
  elements included — numbers as float64, strings as codes into the sorted vocabulary of the path's strings
  (``np.searchsorted`` then answers ``$gt "m"`` as a code comparison), booleans, nulls.

A condition is then one vectorised test over the element table of its value's kind, scattered into a row mask
(any element: :mod:`twotower.retrieval.filters`' list rule), negated against ``present`` for ``$ne`` / ``$nin``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from twotower.retrieval.filters import RANGES, kind

_KINDS = ("number", "string", "bool", "null")


@dataclass
class _Builder:
    present: list[int] = field(default_factory=list)
    rows: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in _KINDS})
    values: dict[str, list] = field(default_factory=lambda: {k: [] for k in _KINDS})

    def scalar(self, row: int, value) -> None:
        k = kind(value)
        if k in _KINDS:
            self.rows[k].append(row)
            self.values[k].append(value)


@dataclass
class _Column:
    present: np.ndarray  # bool (num_docs,)
    rows: dict[str, np.ndarray]  # kind -> int64 rows of the elements
    values: dict[str, np.ndarray]  # number: float64; string: int32 codes into vocab; bool: bool; null: none
    vocab: np.ndarray  # sorted unique strings (object array)


class MetadataColumns:
    """The metadata of ``num_docs`` documents (row order), by path."""

    def __init__(self, metadata: Iterable[dict], num_docs: int) -> None:
        self.num_docs = num_docs
        builders: dict[tuple[str, ...], _Builder] = {}

        def walk(row: int, node: dict, prefix: tuple[str, ...]) -> None:
            for key, value in node.items():
                path = prefix + (key,)
                b = builders.get(path)
                if b is None:
                    b = builders[path] = _Builder()
                b.present.append(row)
                if isinstance(value, dict):
                    walk(row, value, path)
                elif isinstance(value, list):
                    for element in value:
                        b.scalar(row, element)
                else:
                    b.scalar(row, value)

        for row, meta in enumerate(metadata):
            if meta:
                walk(row, meta, ())
        self._columns = {path: self._freeze(b) for path, b in builders.items()}

    def _freeze(self, b: _Builder) -> _Column:
        present = np.zeros(self.num_docs, dtype=bool)
        present[np.asarray(b.present, dtype=np.int64)] = True
        rows = {k: np.asarray(b.rows[k], dtype=np.int64) for k in _KINDS}
        strings = b.values["string"]
        vocab = np.array(sorted(set(strings)), dtype=object)
        codes = np.searchsorted(vocab, np.array(strings, dtype=object)).astype(np.int32) if strings else \
            np.empty(0, dtype=np.int32)
        values = {"number": np.asarray(b.values["number"], dtype=np.float64), "string": codes,
                  "bool": np.asarray(b.values["bool"], dtype=bool), "null": np.empty(0)}
        return _Column(present, rows, values, vocab)

    @classmethod
    def from_docs_jsonl(cls, lines: Iterable[bytes], num_docs: int) -> "MetadataColumns":
        """From the lines of a version's ``docs.jsonl`` (only lines that mention metadata are parsed)."""
        return cls(((json.loads(line).get("metadata") or {}) if b'"metadata"' in line else {} for line in lines),
                   num_docs)

    def paths(self) -> list[str]:
        """The dotted paths present in any document."""
        return sorted(".".join(p) for p in self._columns)

    def _scatter(self, rows: np.ndarray) -> np.ndarray:
        out = np.zeros(self.num_docs, dtype=bool)
        out[rows] = True
        return out

    def _equal_rows(self, col: _Column, values) -> np.ndarray:
        """Rows holding (as the value or a list element) any of ``values``."""
        found = []
        for value in values:
            k = kind(value)
            if k == "null":
                found.append(col.rows["null"])
            elif k == "bool":
                found.append(col.rows["bool"][col.values["bool"] == value])
            elif k == "number":
                found.append(col.rows["number"][col.values["number"] == float(value)])
            else:
                i = int(np.searchsorted(col.vocab, value)) if len(col.vocab) else 0
                if i < len(col.vocab) and col.vocab[i] == value:
                    found.append(col.rows["string"][col.values["string"] == i])
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    def condition(self, path: tuple[str, ...], op: str, value) -> np.ndarray:
        """The row mask of one condition (``filters.Condition``'s semantics)."""
        col = self._columns.get(tuple(path))
        if col is None:  # no document has the path
            return np.full(self.num_docs, op == "$exists" and value is False, dtype=bool)
        if op == "$exists":
            return col.present.copy() if value else ~col.present
        if op in ("$eq", "$ne", "$in", "$nin"):
            hit = self._scatter(self._equal_rows(col, value if op in ("$in", "$nin") else (value,)))
            return hit if op in ("$eq", "$in") else col.present & ~hit
        compare = RANGES[op]
        if kind(value) == "number":
            return self._scatter(col.rows["number"][compare(col.values["number"], float(value))])
        # strings: compare codes with the position ``value`` would take in the sorted vocabulary
        side = "right" if op in ("$gt", "$lte") else "left"
        cut = int(np.searchsorted(col.vocab, value, side=side)) if len(col.vocab) else 0
        codes = col.values["string"]
        keep = codes >= cut if op in ("$gt", "$gte") else codes < cut
        return self._scatter(col.rows["string"][keep])


def columns_of(store) -> MetadataColumns:
    """The store's :class:`MetadataColumns`, built on first use and kept with the (immutable) version."""
    cols = getattr(store, "_metadata_columns", None)
    if cols is None:
        n = len(store)
        cols = MetadataColumns.from_docs_jsonl((store.document_bytes(r) for r in range(n)), n)
        store._metadata_columns = cols
    return cols
