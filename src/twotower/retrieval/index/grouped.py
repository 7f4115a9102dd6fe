"""Searching an index whose documents own several vector rows: passages of long documents (MaxP) and ME-BERT's m
token vectors. Both score a document by its best row; passages built with ``passage_score="first"`` score a document
by its first row (FirstP), searched through a selector over first rows (:func:`row_mask`).

The FAISS index holds rows (passages or token vectors). A search asks it for the top entries, maps each entry to
the document that owns it (``offsets``), and scores those candidate documents exactly over all of their rows, decoded
from the stored type (fp16, int8, bits: :mod:`.codecs`), so a document's score is its best row's, whatever the
index kind. ME-BERT asks for ``k × m`` entries, as the paper does. Passages ask for ``k ×`` :data:`WIDEN` entries and
widen by :data:`WIDEN` until every query has ``k`` distinct documents (or the whole index was asked): a document's
passages can crowd the top entries, and the caller gets ``k`` documents, not ``k`` passages.

Example::

    from twotower.retrieval.index.grouped import search_grouped

    scores, rows = search_grouped(store, store.project_queries(q), 10, ef_search=None, nprobe=None,
                                  candidates=None, rescore_factor=None)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WIDEN = 4  # passages: first k × WIDEN entries, then × WIDEN again until k documents


def first_only(store) -> bool:
    """Whether ``store``'s documents score by their first passage (``passage_score="first"``), not their best."""
    return (store.passages or {}).get("score", "max") == "first"


def row_mask(store, doc_mask: np.ndarray) -> np.ndarray:
    """The vector rows that the documents of ``doc_mask`` let a search see: all of each document's rows, or only its
    first under :func:`first_only`."""
    offsets = np.asarray(store.offsets)
    counts = np.diff(offsets)
    if not first_only(store):
        return np.repeat(doc_mask, counts)
    out = np.zeros(int(offsets[-1]), dtype=bool)
    out[offsets[:-1][doc_mask & (counts > 0)]] = True
    return out


def owners(offsets: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """The document row owning each entry (vector row) of ``entries``; -1 stays -1."""
    out = np.searchsorted(offsets, np.maximum(entries, 0), side="right") - 1
    return np.where(entries >= 0, out, -1)


def entry_search(store, q: np.ndarray, n: int, *, ef_search, nprobe, rescore_factor, sel=None, share: float = 1.0,
                 params=None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``n`` vector rows for each query: ``(scores, entries)``, -1 where fewer. ``sel``: a FAISS ID selector
    over vector rows (a filter letting ``share`` of the documents through), with ``params`` its float index's search
    parameters (:mod:`.filtered` widens the ANN breadth by 1 / share)."""
    from twotower.retrieval.index.kinds import search_params

    index = store.faiss_index
    n = max(1, min(n, index.ntotal))
    if store.codec.vectors == "binary":
        from twotower.retrieval.index.binary import search_binary

        return search_binary(index, q, n, store.codec, store.vectors, rescore_factor=rescore_factor,
                             ef_search=ef_search, nprobe=nprobe, sel=sel, share=share)
    if params is None:
        params = search_params(index, ef_search=ef_search, nprobe=nprobe)
    scores, entries = index.search(q, n, params=params)
    return np.where(entries < 0, -np.inf, scores).astype(np.float32), entries


def search_grouped(store, q: np.ndarray, k: int, *, ef_search, nprobe, candidates, rescore_factor, sel=None,
                   share: float = 1.0, params=None, matching: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` documents by their best row: ``(scores, doc rows)``, each (n_queries, k), -inf / -1 where
    fewer. ``candidates``: entries to ask for (default as the module says); ``sel`` / ``share`` / ``params``: a
    filter's selector over vector rows (:func:`entry_search`); ``matching``: how many documents it lets through (all
    when None)."""
    total = store.faiss_index.ntotal
    m = store.multivector
    n = candidates or k * (m or WIDEN)
    wanted = min(k, len(store) if matching is None else matching)
    while True:
        _, entries = entry_search(store, q, n, ef_search=ef_search, nprobe=nprobe, rescore_factor=rescore_factor,
                                  sel=sel, share=share, params=params)
        if m or candidates or n >= total:
            break
        docs = owners(store.offsets, entries)
        found = min(len(np.unique(row[row >= 0])) for row in docs) if len(docs) else wanted
        if found >= wanted:
            break
        n *= WIDEN
    return reduce_to_documents(q, entries, store.vectors, store.offsets, k, store.codec.decode, first_only(store))


def maxsim_scores(queries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, rows: Sequence[int],
                  decode=None, first: bool = False) -> np.ndarray:
    """Exact ME-BERT (or MaxP passage) scores (n_queries, len(rows)): max over each document's vectors (−inf for a
    document with none). One gather and one matmul for all the rows' vectors, then a segmented max. ``decode``:
    stored rows to float32 (an index's codec: fp16, int8, bits), default a plain cast. ``first``: each document's
    first vector only (passages scored FirstP)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full((len(queries), len(rows)), -np.inf, dtype=np.float32)
    starts = np.asarray(offsets)[rows]
    counts = np.asarray(offsets)[rows + 1] - starts
    if first:
        counts = np.minimum(counts, 1)
    has = counts > 0
    if not has.any():
        return out
    starts, counts = starts[has], counts[has]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # where each document's block starts in the gather
    entry = np.repeat(starts - first, counts) + np.arange(int(counts.sum()))
    block = decode(np.asarray(vectors[entry])) if decode is not None else np.asarray(vectors[entry], dtype=np.float32)
    out[:, has] = np.maximum.reduceat(np.asarray(queries, dtype=np.float32) @ block.T, first, axis=1)
    return out


def reduce_to_documents(
    queries: np.ndarray, entries: np.ndarray, vectors: np.ndarray, offsets: np.ndarray, k: int, decode=None,
    first: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Turn entry hits (n_queries, n) into the top-``k`` documents, re-scored exactly.

    ``entries`` are rows of ``vectors`` (−1 for none); the owner of entry e is the document d
    with offsets[d] <= e < offsets[d+1]. Returns ``(scores, doc_rows)``, (n_queries, k), best
    first, padded with −inf / −1. ``first``: a document scores by its first row (:func:`maxsim_scores`).
    """
    scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    docs = np.full((len(queries), k), -1, dtype=np.int64)
    for qi in range(len(queries)):
        hits = entries[qi][entries[qi] >= 0]
        cand = np.unique(np.searchsorted(offsets, hits, side="right") - 1)
        if len(cand) == 0:
            continue
        s = maxsim_scores(queries[qi : qi + 1], vectors, offsets, cand, decode, first)[0]
        top = np.argsort(-s, kind="stable")[:k]
        scores[qi, : len(top)] = s[top]
        docs[qi, : len(top)] = cand[top]
    return scores, docs
