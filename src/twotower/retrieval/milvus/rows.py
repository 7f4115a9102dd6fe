"""Rows for a Milvus index: Milvus keys documents by id, the Searcher speaks in rows.

A :class:`~twotower.retrieval.milvus.store.MilvusStore` numbers the ids its searches return as it meets them
(``doc_ids`` grows, ``row_of`` — a :class:`RowTable` — maps back and asks Milvus about ids it has not met), so
nothing holds the whole id list in memory.

Example::

    row = store.row_of.intern("doc-1")  # the id's row, numbered now if the store had not met it
    assert store.doc_ids[row] == "doc-1" and store.row_of["doc-1"] == row
"""

from __future__ import annotations

import threading

from twotower.retrieval.milvus.state import documents_visible


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
            it = self._store.client.query_iterator(self._store.collection, batch_size=1000,
                                                   filter=documents_visible(self._store.head), output_fields=["id"])
            try:
                while batch := it.next():
                    for e in batch:
                        self.intern(e["id"])
                        yield e["id"]
            finally:
                it.close()

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
