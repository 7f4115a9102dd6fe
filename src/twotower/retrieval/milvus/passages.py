"""Long documents on a Milvus index: a row per passage, a document scored by its best passage (MaxP), as the local
index does (:mod:`twotower.encoders.passages`, :mod:`twotower.retrieval.index.grouped`).

A document's passages are rows of the collection tied to it by its ``id`` (:func:`.writes.doc_rows`): ``passage``
numbers them, ``span_start`` / ``span_end`` place them in the document's text, and every one carries the document's
metadata, so a filter selects a document's passages together. They are written, made visible, replaced and removed
by the same write as their document (:mod:`.writes`), so no reader sees some of them.

- :func:`search_documents`: Milvus' top rows grouped by document, each document by its best row, asked again for
  4× more rows until ``k`` distinct documents come back (or every row was seen). On a FLAT index the rows are the
  exact top ones, so the documents and their scores are exactly the local flat index's.
- :func:`passage_table`: the spans and vectors of some documents' passages (a hit's best passages, PRF's feedback).

Example::

    scores, rows = search_documents(store, [q], 10, lambda n: {"metric_type": "IP", "params": {}})
    spans, vectors = passage_table(store, rows[0][:1])[int(rows[0][0])]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from twotower.checks import given
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.state import visible

MAX_TOPK = 16_384  # Milvus' largest limit per search
_TEXT = re.compile(r"\btext like\b")  # a $text condition in a filter's expression (filters.to_milvus_expr)
WIDEN = 4  # rows asked per document wanted, and the factor each widening multiplies them by (as grouped.py)


def split_any(store) -> bool:
    """Whether ``store`` (one committed write) holds a document of several passages (rows outnumber documents):
    without one, every search and passage is a document's own row, read as without passages."""
    return bool(store.passages) and int(store.manifest.get("num_vectors") or 0) > int(store.manifest["num_docs"])


def check_rows(root: Path, docs, passages: dict | None) -> None:
    """``docs`` (a ``NewDocs``) fit an index with ``passages`` (its spec's entry, None: none): several vectors per
    document only as passages with their spans, and only into an index that keeps passages."""
    if docs.offsets is not None and (docs.spans is None or passages is None):
        raise IndexStoreError(f"{root}: a Milvus index holds one vector per document or per passage; these documents "
                              f"are multi-vector (use {given('backend', 'faiss')})")


def search_documents(store, queries: np.ndarray, k: int, params: Callable[[int], dict], expr: str = "",
                     depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` documents for each query vector of ``queries`` (float32) by their best passage: ``(scores,
    rows)``, each (n, k), best first, -inf / -1 where fewer; ``params(limit)``: the search parameters for ``limit``
    rows; ``depth``: the rows asked per ``k`` (binary vectors: ``k × rescore_factor``, each rescored: :mod:`.vectors`);
    ``expr``: a metadata filter's expression (every passage of a document carries its metadata). A filter on the
    text (``$text``: ``text like``; only a document's own row holds its text) selects documents first, then
    searches among their ids, :data:`.writes.BATCH` at a time, keeping each query's best ``k`` of all."""
    if k > MAX_TOPK:
        raise IndexStoreError(f"k {k}: Milvus returns at most {MAX_TOPK} hits per query; ask for fewer")
    if _TEXT.search(expr):
        from twotower.retrieval.milvus.writes import BATCH

        with store._errors("searching"):  # every matching id (a query without a limit returns all)
            ids = sorted({e["id"] for e in store.client.query(store.collection, filter=store._doc_rows_where(expr),
                                                              output_fields=["id"])})
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i in range(0, len(ids), BATCH):
            s, r = _search(store, queries, k, params, mc.ids_filter(ids[i:i + BATCH]), depth)
            scores, rows = np.concatenate([scores, s], axis=1), np.concatenate([rows, r], axis=1)
            order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
            scores, rows = np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)
        return scores, rows
    return _search(store, queries, k, params, expr, depth)


def _search(store, queries: np.ndarray, k: int, params: Callable[[int], dict], expr: str,
            depth: int | None) -> tuple[np.ndarray, np.ndarray]:
    data = store.kind.queries(queries)
    scores = np.full((len(data), k), -np.inf, dtype=np.float32)
    rows = np.full((len(data), k), -1, dtype=np.int64)
    pending, limit = list(range(len(data))), min(MAX_TOPK, (depth or k) * WIDEN)
    while pending:
        again = []
        for start in range(0, len(pending), 64):
            chunk = pending[start:start + 64]
            with store._errors("searching"):
                found = store.client.search(store.collection, data=[data[i] for i in chunk], anns_field=mc.DENSE,
                                            limit=limit, search_params=params(limit),
                                            output_fields=["id", *store.kind.fields[1:]], filter=store._visible(expr))
            for i, hits in zip(chunk, found):
                best: dict[str, float] = {}
                for entity, score in store.kind.ranked(hits, queries[i]):  # best first: a document's best passage
                    best.setdefault(entity["id"], score)
                if len(best) < k and len(hits) >= limit and limit < MAX_TOPK:
                    again.append(i)  # fewer than k documents in the rows seen, and more rows to see
                    continue
                for j, (doc_id, score) in enumerate(list(best.items())[:k]):
                    scores[i, j], rows[i, j] = score, store.row_of.intern(doc_id)
        pending, limit = again, min(MAX_TOPK, limit * WIDEN)
    return scores, rows


def passage_table(store, rows: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{row: (spans, vectors)}`` of the documents ``rows`` (a store's rows): their passages' ``(start, end)``
    offsets (p, 2) and dense vectors (p, dim), in passage order. A document no longer visible is left out, and
    all of them when no document has several passages (:func:`split_any`)."""
    if not split_any(store):  # every document one passage: its whole text (the hit's passage needs no query)
        return {}
    wanted = {store.doc_ids[int(r)]: int(r) for r in rows if int(r) >= 0}
    ids = list(wanted)
    parts: dict[str, list] = {}
    with store._errors("reading passages"):
        for i in range(0, len(ids), 64):  # all rows of 64 documents a query (not pymilvus' iterator: writes.read_rows)
            where = f"{mc.ids_filter(ids[i:i + 64])} and ({visible(store.head)})"
            for e in store.client.query(store.collection, filter=where,
                                        output_fields=["id", "passage", "span_start", "span_end", *store.kind.fields]):
                parts.setdefault(e["id"], []).append(e)
    out = {}
    for doc_id, found in parts.items():
        found.sort(key=lambda e: int(e["passage"]))
        spans = np.asarray([[int(e["span_start"]), int(e["span_end"])] for e in found], dtype=np.int64)
        vectors = store.kind.decode(found)
        out[wanted[doc_id]] = (spans, vectors)
    return out


def best_passage_vectors(store, queries: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
    """The vector of each document in ``doc_rows`` (n_queries, d) that scores best for its query (``queries``:
    projected, one per row of ``doc_rows``): (n_queries, d, dim), what pseudo-relevance feedback reads."""
    if not split_any(store):
        return store.float_vectors(doc_rows)
    table = passage_table(store, np.unique(doc_rows))
    out = np.empty((*doc_rows.shape, store.dim), dtype=np.float32)
    for i, docs in enumerate(doc_rows):
        for j, row in enumerate(docs):
            vectors = table[int(row)][1]
            out[i, j] = vectors[int(np.argmax(vectors @ queries[i]))]
    return out


__all__ = ["best_passage_vectors", "check_rows", "passage_table", "search_documents", "split_any"]
