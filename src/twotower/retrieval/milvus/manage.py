"""Managing a Milvus index's documents without a query (:mod:`twotower.retrieval.manage` says what each does):
the ids a filter selects, their records, deleting them and changing their metadata, each write one committed write
made by the store's own write path (:mod:`.writes`: crash-safe, rerunnable).

- Selection: one Milvus query of the ids that the committed write's rows (:func:`.state.visible`) and the filter's
  expression (:meth:`MilvusStore.filter_expression`: refused where Milvus would answer differently) select, sorted
  by id here (Milvus has no order for a query): a page costs a read of every matching id.
- Delete: the selected ids removed in one write (``MilvusStore.remove``).
- Metadata: the selected documents written again with their stored title, text and dense vectors (every passage's,
  with its span) and the new metadata
  (``MilvusStore.add(..., replace=True)``): one write; no encoding. Their BM25 sparse vectors are recomputed from the
  same text with the build's ``avgdl`` and so come out the same (the lexicon's df and count go out and back in the
  same write); the tests compare them before and after.

The selection is read before the write starts: a writer on another machine that removes one of the selected
documents in between makes the write fail with the id named (nothing written); run it again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from twotower.retrieval.filters import parse_filter
from twotower.retrieval.index.errors import UnknownIdError, WouldEmptyError
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.passages import split_any
from twotower.retrieval.milvus.rows import read_visible, scan


def _expr(store, flt) -> str:
    return store.filter_expression(parse_filter(flt))  # parsed already when it comes from retrieval.manage


def matching_ids(store, flt=None, ids: Sequence[str] | None = None, *, after: str | None = None) -> list[str]:
    """The ids selected: of ``ids`` (all known, else an error) those the filter lets through, in their order; without
    ``ids`` every matching id, sorted — with ``after``, only those above it (Milvus compares strings by their UTF-8
    bytes, which is code point order)."""
    expr = _expr(store, flt)
    if after is not None and ids is None:
        expr = f"(id > {mc.quote(after)})" + (f" and ({expr})" if expr else "")
    if ids is not None:
        ids = list(ids)
        store.rows(ids)  # unknown ids: an error naming them
        if not expr:
            return ids
        passed = read_visible(store, ids, ["id"], expr)
        return [d for d in ids if d in passed]
    with store._errors("listing document ids"):
        found = scan(store.client, store.collection, store._doc_rows_where(expr), ["id"])
        return sorted({e["id"] for e in found})


def read_records(store, ids: Sequence[str], *, vectors: bool = False) -> list[dict]:
    """``{"_id", "title", "text"[, "metadata"]}`` of each of ``ids`` (with ``"vector"``: its dense vector), in order."""
    fields = ["title", "text", mc.METADATA] + (store.kind.fields if vectors else [])
    found = store._query(list(ids), fields)
    missing = [d for d in ids if d not in found]
    if missing:
        raise UnknownIdError(f"{store.root}: {len(missing)} document id(s) not in the index (Milvus collection "
                             f"'{store.collection}'): " + ", ".join(repr(d) for d in missing[:5]))
    out = []
    for d in ids:
        e = found[d]
        doc = {"_id": d, "title": e["title"], "text": e["text"]}
        if e.get(mc.METADATA):
            doc["metadata"] = e[mc.METADATA]
        if vectors:
            doc["vector"] = store.kind.decode([e])[0].tolist()
        out.append(doc)
    return out


def _check_left(store, n: int) -> None:
    if n >= len(store):
        raise WouldEmptyError(f"{store.root}: the selection holds all {len(store)} documents, and an index keeps at "
                              "least one: narrow the filter (or build a new index)")


def delete_where(store, flt=None, ids: Sequence[str] | None = None, *, keep: int = 2):
    """``(the new store, the ids deleted)``: the selected documents removed in one committed write."""
    live = store.refresh()
    chosen = matching_ids(live, flt, ids)
    if not chosen:
        return live, []
    _check_left(live, len(chosen))
    return live.remove(chosen, keep=keep, show_progress=False), chosen


def update_where(store, change, flt=None, ids: Sequence[str] | None = None, *, keep: int = 2):
    """``(the new store, the ids updated)``: the selected documents' metadata set to ``change(id, old)``, in one
    committed write that re-encodes nothing (module docstring)."""
    live = store.refresh()
    chosen = matching_ids(live, flt, ids)
    if not chosen:
        return live, []
    split = split_any(live)  # some document has several passages: read each one's rows
    docs = read_records(live, chosen, vectors=not split)
    metadata = [change(d["_id"], d.get("metadata") or {}) for d in docs]
    ids, titles, texts = [d["_id"] for d in docs], [d["title"] for d in docs], [d["text"] for d in docs]
    if split:  # every passage written again, its vector and span as they were
        table = live.passage_table(live.rows(ids))
        parts = [table[live.row_of[d]] for d in ids]
        offsets = np.concatenate([[0], np.cumsum([len(s) for s, _ in parts])]).astype(np.int64)
        new = NewDocs(ids, titles, texts, np.concatenate([v for _, v in parts]).astype(np.float32), offsets,
                      metadata=metadata, spans=np.concatenate([s for s, _ in parts]))
    else:
        new = NewDocs(ids, titles, texts, np.asarray([d["vector"] for d in docs], dtype=np.float32),
                      metadata=metadata)
    return live.add(new, replace=True, keep=keep, show_progress=False), chosen


__all__ = ["delete_where", "matching_ids", "read_records", "update_where"]
