"""Metadata filters on a Milvus index, with exactly the meaning :meth:`Filter.matches` gives them, or refused.

:func:`twotower.retrieval.filters.to_milvus_expr` writes a filter as an expression over the collection's JSON
``metadata`` field. Milvus (Lite 3.2.2, and the 2.5 engine it embeds) differs from the reference semantics in three
places, and has no function that tells a JSON value's type (no ``json_typeof``), so no expression can tell them apart:

- a boolean equals the numbers 1 / 0 and orders among numbers (``metadata["ok"] == 1`` and ``> 0`` find
  ``"ok": true``; ``json_contains_any(tags, [1])`` finds ``[true]``);
- a range operator on a field holding a list compares the list, not its elements (never true);
- a field holding null reads as missing (``exists`` is false for it, and so ``$ne`` / ``$nin`` skip it).

So the collection's state keeps, per dotted path, the kinds of value its documents have held there
(:func:`metadata_kinds`, merged by every write, never shrunk by removals), and :func:`milvus_filter` refuses a
condition only where a document could be answered differently:

- a number compared (``$eq $ne $gt $gte $lt $lte $in $nin``) on a path that has held a boolean (as a value or a list
  element), or a boolean compared on a path that has held a number;
- ``$gt $gte $lt $lte`` on a path that has held a list;
- ``$exists``, ``$ne`` or ``$nin`` on a path that has held null;
- under ``$not``, ``$gt $gte $lt $lte`` on a path that has held values of another kind than the compared one
  (:mod:`twotower.retrieval.filters.milvus`); and a ``$text`` phrase holding a backslash.

The refusal is a :class:`~twotower.DataError` naming the path, the operator and what to do instead. Everything else
(the tests hold a table of such filters against the local index) selects the same documents as locally.
"""

from __future__ import annotations

from typing import Any

from twotower.checks import given
from twotower.data.metadata import kind
from twotower.errors import DataError
from twotower.retrieval.filters import And, Condition, Filter, Not, Or, parse_filter, to_milvus_expr

FIELD = "metadata"  # the collection's JSON field
RANGE_OPS = ("$gt", "$gte", "$lt", "$lte")


def metadata_kinds(metadatas, into: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """``{dotted path: sorted kinds}`` of the values in ``metadatas`` (dicts), merged into ``into``: a value's kind
    (``string number bool null list object``) and, for a list, ``list:<kind>`` of each element. Paths do not step
    into lists (as filters do not)."""
    seen: dict[str, set[str]] = {p: set(k) for p, k in (into or {}).items()}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            kinds = seen.setdefault(path, set())
            k = kind(value)
            kinds.add(k)
            if k == "list":
                kinds.update(f"list:{kind(e)}" for e in value)
            elif k == "object":
                walk(value, path + ".")

    for m in metadatas:
        if m:
            walk(m, "")
    return {p: sorted(k) for p, k in sorted(seen.items())}


def _refuse(c: Condition, why: str, hint: str) -> DataError:
    name = ".".join(c.path)
    return DataError("filter", f"{c.op} on '{name}' cannot be answered exactly on a Milvus index: {why}",
                     field=f"{name}.{c.op}", hint=hint)


def _check(c: Condition, kinds: dict[str, list[str]]) -> None:
    held = set(kinds.get(".".join(c.path), ()))
    if not held:
        return
    name = ".".join(c.path)
    values: tuple[Any, ...] = c.value if c.op in ("$in", "$nin") else (c.value,)
    if c.op != "$exists":
        value_kinds = {kind(v) for v in values}
        if "number" in value_kinds and held & {"bool", "list:bool"}:
            raise _refuse(c, f"documents hold booleans in '{name}' and Milvus equals true with 1 and false with 0",
                          "keep booleans and numbers in different fields, or search this index's documents on the "
                          f"local backend ({given('backend', 'faiss')})")
        if "bool" in value_kinds and held & {"number", "list:number"}:
            raise _refuse(c, f"documents hold numbers in '{name}' and Milvus equals true with 1 and false with 0",
                          f"keep booleans and numbers in different fields, or use {given('backend', 'faiss')}")
    if c.op in RANGE_OPS and "list" in held:
        raise _refuse(c, f"documents hold lists in '{name}' and Milvus compares a list, not its elements",
                      f"compare a scalar field, or use {given('backend', 'faiss')}")
    if c.op in ("$exists", "$ne", "$nin") and "null" in held:
        raise _refuse(c, f"documents hold null in '{name}' and Milvus reads null as a missing field",
                      "store a value other than null (or leave the field out) to mean 'none', or use "
                      f"{given('backend', 'faiss')}")


def _check_negated(c: Condition, kinds: dict[str, list[str]]) -> None:
    """Under ``$not``, a range on a path that has held values of another kind than the compared one (Milvus answers
    "unknown" there, and its ``not`` keeps it unknown: :mod:`twotower.retrieval.filters.milvus`)."""
    if c.op not in RANGE_OPS:
        return
    other = set(kinds.get(".".join(c.path), ())) - {kind(c.value), "null"}
    if other:
        name = ".".join(c.path)
        raise _refuse(c, f"under $not, documents hold {', '.join(sorted(other))} in '{name}', which Milvus cannot "
                      f"compare with a {kind(c.value)}", "keep one kind of value per field, or use "
                      f"{given('backend', 'faiss')}")


def milvus_filter(flt: Filter | dict | str | None, kinds: dict[str, list[str]]) -> str:
    """The Milvus expression of ``flt`` over the ``metadata`` field (``""`` for no filter), after refusing the
    conditions Milvus would answer differently given the ``kinds`` the collection's documents have held (see the
    module's docstring).

    Example::

        kinds = metadata_kinds([{"src": "wiki", "ok": True}])
        assert milvus_filter({"src": "wiki"}, kinds).startswith('(metadata["src"] == "wiki"')
    """
    flt = parse_filter(flt)

    def walk(f: Filter, negated: bool = False) -> None:
        if isinstance(f, Condition):
            _check(f, kinds)
            if negated:
                _check_negated(f, kinds)
        elif isinstance(f, (And, Or)):
            for part in f.parts:
                walk(part, negated)
        elif isinstance(f, Not):
            walk(f.part, not negated)

    walk(flt)
    return to_milvus_expr(flt, FIELD)


__all__ = ["FIELD", "metadata_kinds", "milvus_filter"]
