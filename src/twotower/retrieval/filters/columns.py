"""Evaluate over columns: the metadata of one index version as numpy columns, for evaluating filters with numpy
instead of per document in Python.

Built once per opened version (:func:`columns_of` caches it on the store) from the metadata in ``docs.jsonl``,
column by column (a list comprehension per key, not a Python walk per document). Every path into the metadata's
nested objects gets dense arrays, one entry per document row:

- ``present`` (the path exists, whatever its value) and ``null`` (it holds null);
- ``num`` (float64, NaN where the value is not a number), ``codes`` (int32 codes into the sorted vocabulary of the
  path's strings, -1 where not a string: ``np.searchsorted`` on the vocabulary turns ``$gt "m"`` into a code
  comparison), ``flag`` (int8: 1 true, 0 false, -1 not a boolean);

and, for the rows where the path holds a list, an *element table*: the ``(row, value)`` pairs of the list's scalar
elements, by kind. A condition is one vectorised test over the dense arrays, OR-ed with the same test over the
element table scattered into rows (a list matches when any element does: :mod:`twotower.retrieval.filters`), and
negated against ``present`` for ``$ne`` / ``$nin``. Metadata never holds NaN (``data.metadata``), so NaN can mark
"not a number".
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import operator
from dataclasses import dataclass

import numpy as np

from twotower.data.metadata import kind
from twotower.retrieval.filters.text import TextScan

# the range operators of the filter language, as numpy comparisons (scalars and columns alike)
RANGES = {"$gt": np.greater, "$gte": np.greater_equal, "$lt": np.less, "$lte": np.less_equal}

_MISSING = object()
_NUMBER = (int, float)


@dataclass
class _Column:
    present: np.ndarray  # bool
    null: np.ndarray  # bool
    num: np.ndarray  # float64, NaN: no number
    codes: np.ndarray  # int32 into vocab, -1: no string
    flag: np.ndarray  # int8: 1 / 0, -1: no boolean
    vocab: np.ndarray  # sorted strings (object array) of the path, list elements included
    el_rows: dict  # kind -> int64 rows of list elements ("number", "string", "bool", "null")
    el_values: dict  # kind -> values (number float64, string int32 codes, bool int8)


_NUM, _STR, _BOOL, _NULL, _LIST, _OBJ, _ABSENT = range(7)
_TYPE_CODE = {int: _NUM, float: _NUM, str: _STR, bool: _BOOL, type(None): _NULL, list: _LIST, dict: _OBJ,
              type(_MISSING): _ABSENT}


def _rows_of(codes: np.ndarray, code: int) -> list[int]:
    return np.flatnonzero(codes == code).tolist()


def _column(vals: list, n: int) -> _Column:
    """One path's arrays from its value in each row (``_MISSING`` where absent); C-speed passes (``map``) only."""
    kinds = np.fromiter(map(_TYPE_CODE.__getitem__, map(type, vals)), dtype=np.int8, count=n)
    at = vals.__getitem__
    num = np.full(n, np.nan)
    rows = _rows_of(kinds, _NUM)
    num[rows] = np.fromiter(map(at, rows), dtype=np.float64, count=len(rows))
    flag = np.full(n, -1, dtype=np.int8)
    rows = _rows_of(kinds, _BOOL)
    flag[rows] = np.fromiter(map(at, rows), dtype=np.int8, count=len(rows))
    str_rows = _rows_of(kinds, _STR)
    strings = list(map(at, str_rows))
    lists = list(map(at, _rows_of(kinds, _LIST)))  # list elements: flattened, typed and grouped in C-speed passes
    flat = list(itertools.chain.from_iterable(lists))
    owner = np.repeat(np.flatnonzero(kinds == _LIST), np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)))
    el_kinds = np.fromiter(map(_TYPE_CODE.__getitem__, map(type, flat)), dtype=np.int8, count=len(flat))

    def elements(code: int) -> tuple[np.ndarray, list]:
        where = np.flatnonzero(el_kinds == code)
        return owner[where], list(map(flat.__getitem__, where.tolist()))

    el = {name: elements(code) for name, code in (("number", _NUM), ("string", _STR), ("bool", _BOOL),
                                                   ("null", _NULL))}
    vocab_list = sorted(set(strings) | set(el["string"][1]))
    code_of = {s: c for c, s in enumerate(vocab_list)}.__getitem__
    codes = np.full(n, -1, dtype=np.int32)
    codes[str_rows] = np.fromiter(map(code_of, strings), dtype=np.int32, count=len(strings))
    el_rows = {name: rows for name, (rows, _) in el.items()}
    el_values = {"number": np.asarray(el["number"][1], dtype=np.float64),
                 "string": np.fromiter(map(code_of, el["string"][1]), dtype=np.int32),
                 "bool": np.asarray(el["bool"][1], dtype=np.int8),
                 "null": np.zeros(len(el["null"][0]), dtype=np.int8)}
    return _Column(kinds != _ABSENT, kinds == _NULL, num, codes, flag, np.array(vocab_list, dtype=object), el_rows,
                   el_values)


class MetadataColumns:
    """The metadata of ``num_docs`` documents (row order; ``metadata`` a list of dicts), by path."""

    def __init__(self, metadata: list, num_docs: int) -> None:
        self.num_docs = num_docs
        self._columns: dict[tuple[str, ...], _Column] = {}
        self._add([m if type(m) is dict else {} for m in metadata], ())

    def _add(self, docs: list, prefix: tuple[str, ...]) -> None:
        """Columns for the keys of ``docs`` (one dict per row; ``{}`` for none)."""
        for key in sorted(set().union(*docs)):
            vals = list(map(operator.methodcaller("get", key, _MISSING), docs))
            path = prefix + (key,)
            self._columns[path] = _column(vals, self.num_docs)
            if dict in set(map(type, vals)):
                self._add([v if type(v) is dict else {} for v in vals], path)

    @classmethod
    def from_docs_jsonl(cls, data: bytes, num_docs: int) -> "MetadataColumns":
        """From a version's ``docs.jsonl`` (its bytes): the ``"metadata"`` object of each line (written last, after
        ``_id``, ``title`` and ``text``, whose strings escape quotes, so the first ``, "metadata": {`` of a line is
        the key itself) is cut out and all of them parsed in one ``json.loads``; a line without it has none."""
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        if len(lines) != num_docs:
            raise ValueError(f"docs.jsonl holds {len(lines)} lines for {num_docs} documents")
        marker = b', "metadata": {'
        cut = len(marker) - 1
        parts = [line[line.find(marker) + cut : -1] if marker in line else b"{}" for line in lines]
        try:
            metadata = json.loads(b"[" + b",".join(parts) + b"]")
        except ValueError:  # written otherwise (by hand, another tool): each line parsed whole
            metadata = [json.loads(line).get("metadata") or {} for line in lines]
        return cls(metadata, num_docs)

    text_source = None  # phrase -> row mask over the documents' text (set by columns_of: filters.text)

    def contains(self, phrase: str) -> np.ndarray:
        """The rows whose text holds ``phrase`` (a ``$text`` filter's mask)."""
        if self.text_source is None:
            raise ValueError("these metadata columns were built without the documents' text")
        return self.text_source(phrase)

    def paths(self) -> list[str]:
        """The dotted paths present in any document."""
        return sorted(".".join(p) for p in self._columns)

    def _with_elements(self, dense: np.ndarray, col: _Column, k: str, test) -> np.ndarray:
        """``dense`` OR-ed with the rows whose list holds an element of kind ``k`` passing ``test``."""
        rows = col.el_rows[k]
        if len(rows):
            dense = dense.copy() if dense.base is not None else dense
            dense[rows[test(col.el_values[k])]] = True
        return dense

    def _code(self, col: _Column, value: str) -> int:
        i = int(np.searchsorted(col.vocab, value)) if len(col.vocab) else 0
        return i if i < len(col.vocab) and col.vocab[i] == value else -2  # -2: no row has it

    def _equal(self, col: _Column, value) -> np.ndarray:
        k = kind(value)
        if k == "null":
            return self._with_elements(col.null.copy(), col, "null", lambda v: np.ones(len(v), dtype=bool))
        if k == "bool":
            return self._with_elements(col.flag == int(value), col, "bool", lambda v: v == int(value))
        if k == "number":
            return self._with_elements(col.num == float(value), col, "number", lambda v: v == float(value))
        code = self._code(col, value)
        return self._with_elements(col.codes == code, col, "string", lambda v: v == code)

    def condition(self, path: tuple[str, ...], op: str, value) -> np.ndarray:
        """The row mask of one condition (:class:`~twotower.retrieval.filters.parse.Condition`'s semantics)."""
        col = self._columns.get(tuple(path))
        if col is None:  # no document has the path
            return np.full(self.num_docs, op == "$exists" and value is False, dtype=bool)
        if op == "$exists":
            return col.present.copy() if value else ~col.present
        if op in ("$eq", "$ne", "$in", "$nin"):
            hit = np.zeros(self.num_docs, dtype=bool)
            for v in (value if op in ("$in", "$nin") else (value,)):
                hit |= self._equal(col, v)
            return hit if op in ("$eq", "$in") else col.present & ~hit
        compare = RANGES[op]
        if kind(value) == "number":
            x = float(value)
            return self._with_elements(compare(col.num, x), col, "number", lambda v: compare(v, x))
        # strings: compare codes with the position ``value`` would take in the sorted vocabulary
        cut = int(np.searchsorted(col.vocab, value, side="right" if op in ("$gt", "$lte") else "left")) \
            if len(col.vocab) else 0

        def test(codes):
            return (codes >= cut) if op in ("$gt", "$gte") else (codes >= 0) & (codes < cut)

        return self._with_elements(test(col.codes), col, "string", test)


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector paused: parsing a million small objects otherwise triggers collections that
    walk the whole growing heap (3-4× slower, measured); none of these objects form cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def columns_of(store) -> MetadataColumns:
    """The store's :class:`MetadataColumns`, built on first use and kept with the (immutable) version."""
    cols = getattr(store, "_metadata_columns", None)
    if cols is None:  # a version's files never change: read once
        with _no_gc():
            cols = MetadataColumns.from_docs_jsonl((store.dir / "docs.jsonl").read_bytes(), len(store))
        cols.text_source = TextScan(store)
        store._metadata_columns = cols
    return cols


__all__ = ["RANGES", "MetadataColumns", "columns_of"]
