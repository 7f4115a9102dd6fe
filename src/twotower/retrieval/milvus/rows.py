"""Rows for a Milvus index: Milvus keys documents by id, the Searcher speaks in rows.

A :class:`~twotower.retrieval.milvus.store.MilvusStore` numbers the ids its searches return as it meets them
(``doc_ids`` grows, ``row_of`` — a :class:`RowTable` — maps back and asks Milvus about ids it has not met), so
nothing holds the whole id list in memory.

Reads by id (:func:`read_visible`) go to Milvus in batches as large as Milvus allows: in Milvus Lite each
``id in [...]`` query is a pass over every row of the collection (only a ``pk in [...]`` query looks rows up), so
5,000 ids cost one pass, not five as in batches of 1,024 (issue #54).

Example::

    row = store.row_of.intern("doc-1")  # the id's row, numbered now if the store had not met it
    assert store.doc_ids[row] == "doc-1" and store.row_of["doc-1"] == row
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.state import documents_visible

READ_BATCH = 16_384  # ids per query: Milvus' query result window (limit + offset, and rows per query, at most 16,384)
# a server refuses a result over its byte limit (quotaAndLimits.limits.maxOutputSize, 100 MB by default: "query
# results exceed the limit size") or over its gRPC message size ("larger than max"): the batch is then split in halves
_TOO_LARGE = ("limit size", "maxoutputsize", "larger than max", "message larger")


def _too_large(exc: BaseException) -> bool:
    return mc._is_milvus(exc) and any(w in mc._message(exc).lower() for w in _TOO_LARGE)


def read_visible(store, ids: Sequence[str], fields: Sequence[str], expr: str = "") -> dict[str, dict]:
    """The document rows of ``ids`` that ``store``'s committed write shows (:func:`.state.documents_visible`: a
    document's own row, not its further passages') and ``expr`` (a Milvus expression,
    :meth:`~.store.MilvusStore.filter_expression`) selects, by id, each with ``id`` and ``fields``: one query per :data:`READ_BATCH` distinct ids; a batch whose result the server finds too large is asked again in
    halves. Ids no visible row holds are absent."""
    ids = list(dict.fromkeys(ids))
    where = store._doc_rows_where(expr)  # a document's own row (passage 0), not its further passages' rows
    fields = ["id", *(f for f in fields if f != "id")]
    out: dict[str, dict] = {}

    def ask(chunk: list[str]) -> None:
        try:
            rows = store.client.query(store.collection, filter=f"{mc.ids_filter(chunk)} and ({where})",
                                      output_fields=fields)
        except Exception as exc:
            if len(chunk) == 1 or not _too_large(exc):
                raise
            ask(chunk[:len(chunk) // 2])
            ask(chunk[len(chunk) // 2:])
            return
        for e in rows:
            out[e["id"]] = e

    with store._errors("reading documents"):
        for i in range(0, len(ids), READ_BATCH):
            ask(ids[i:i + READ_BATCH])
    return out


def scan(client, collection: str, expr: str, fields: Sequence[str], batch: int = 1000):
    """Every row ``expr`` selects, with ``fields`` and ``pk``, in pages of ``batch`` rows in key order: Milvus' own
    query-iterator paging (``iterator`` and ``reduce_stop_for_best`` set, each page the ``batch`` smallest keys above
    the last one), with the key quoted by :func:`.client.quote`. pymilvus' ``query_iterator`` pastes the last key
    between double quotes unescaped, so an id holding ``"`` or ``\\`` broke the listing (issue #54)."""
    fields = list(dict.fromkeys(["pk", *fields]))
    last = None
    while True:
        where = expr if last is None else f"pk > {mc.quote(last)} and ({expr})"
        rows = client.query(collection, filter=where, output_fields=fields, limit=batch, iterator="True",
                            reduce_stop_for_best="True")
        rows.sort(key=lambda e: e["pk"])
        yield from rows
        if len(rows) < batch:
            return
        last = rows[-1]["pk"]


class RowTable:
    """``row_of``: id -> row for the ids a store has met; an id it has not met is looked up in Milvus."""

    def __init__(self, store) -> None:
        self._store = store
        self._rows: dict[str, int] = {}
        self._lock = threading.Lock()

    def intern(self, doc_id: str) -> int:
        with self._lock:
            row = self._rows.get(doc_id)
            if row is None:
                row = self._rows[doc_id] = len(self._store.doc_ids)
                self._store.doc_ids.append(doc_id)
            return row

    def __iter__(self):
        """Every id in the collection (read in batches; each numbered): for the rare caller that needs them all."""
        with self._store._errors("listing document ids"):
            for e in scan(self._store.client, self._store.collection, documents_visible(self._store.head), ["id"]):
                self.intern(e["id"])
                yield e["id"]

    def __contains__(self, doc_id) -> bool:
        return self.get(doc_id) is not None

    def __getitem__(self, doc_id: str) -> int:
        row = self.get(doc_id)
        if row is None:
            raise KeyError(doc_id)
        return row

    def get(self, doc_id, default=None):
        if not isinstance(doc_id, str):
            return default
        if doc_id in self._rows:
            return self._rows[doc_id]
        return self.intern(doc_id) if self._store.existing([doc_id]) else default

    def known(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` in the index (each numbered), asked in batched queries, not one per id."""
        with self._lock:
            found = {d for d in ids if isinstance(d, str) and d in self._rows}
        rest = [d for d in dict.fromkeys(ids) if d not in found and isinstance(d, str)]
        if rest:
            for d in read_visible(self._store, rest, ["id"]):
                self.intern(d)
                found.add(d)
        return found
