"""Searching one version of a local index through FAISS: reading its ``faiss.index`` and answering a top-k search.

:func:`search_version` picks the path by what the version holds and what the search asks: a row mask (a metadata
filter's) goes to :mod:`.filtered`, a binary index to :mod:`.binary` (Hamming, then rescored); a float index is
searched by FAISS with the call's ``ef_search`` / ``nprobe`` and its misses padded to ``k``; an index with several
rows a document (passages, ME-BERT) goes to :mod:`.grouped` (entries reduced to documents, re-scored exactly). Queries come
in already projected into the stored space (:meth:`IndexStore.project_queries
<twotower.retrieval.store.IndexStore.project_queries>`).

Example::

    from twotower.retrieval.store import IndexStore

    store = IndexStore.open("my-index")
    scores, rows = search_version(store, store.project_queries(queries), 10, ef_search=None, nprobe=None,
                                  candidates=None, rescore_factor=None, mask=None)
"""

from __future__ import annotations

import numpy as np

from twotower.retrieval.index.files import corrupt
from twotower.retrieval.index.kinds import search_params


def read_faiss(store):
    """``store``'s ``faiss.index`` (a binary index for binary vectors), memory-mapped read-only where FAISS can; its
    sha256 checked on this first read and its vector count against the manifest's."""
    import faiss

    store.files.ensure("faiss.index")
    path = str(store.dir / "faiss.index")
    read = faiss.read_index_binary if store.codec.vectors == "binary" else faiss.read_index
    try:
        index = read(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:
        index = read(path)
    if index.ntotal != store.manifest["num_vectors"]:
        raise corrupt(store.dir, f"faiss.index holds {index.ntotal} vectors, expected "
                                 f"{store.manifest['num_vectors']}", "num_vectors")
    return index


def search_version(store, q: np.ndarray, k: int, *, ef_search: int | None, nprobe: int | None,
                   candidates: int | None, rescore_factor: int | None,
                   mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`IndexStore.search <twotower.retrieval.store.IndexStore.search>` for the projected queries ``q``:
    ``(scores, rows)``, each (n_queries, min(k, documents)), best first; row -1 and score -inf where fewer. ``k``
    is cut to the number of documents and ``ef_search`` to the number of vectors: more finds nothing more, and FAISS
    would allocate for it (a k or an efSearch of 2**31 - 1 asked for GiB and took tens of seconds)."""
    k = min(int(k), max(1, len(store)))
    if ef_search is not None:
        ef_search = min(int(ef_search), max(1, int(store.manifest.get("num_vectors") or len(store))))
    if mask is None and store.offsets is not None:
        from twotower.retrieval.index.grouped import first_only

        if first_only(store):  # FirstP: FAISS sees only first rows, through the filtered path's selector
            mask = np.ones(len(store), dtype=bool)
    if mask is not None:
        from twotower.retrieval.index.filtered import search_masked

        return search_masked(store, q, max(1, k), mask, ef_search=ef_search, nprobe=nprobe, candidates=candidates,
                             rescore_factor=rescore_factor)
    if store.offsets is not None:  # passages or ME-BERT: several rows a document, scored by its best
        from twotower.retrieval.index.grouped import search_grouped

        return search_grouped(store, q, max(1, k), ef_search=ef_search, nprobe=nprobe, candidates=candidates,
                              rescore_factor=rescore_factor)
    index = store.faiss_index
    if store.codec.vectors == "binary":
        from twotower.retrieval.index.binary import search_binary

        return search_binary(index, q, k, store.codec, store.vectors, rescore_factor=rescore_factor,
                             ef_search=ef_search, nprobe=nprobe)
    params = search_params(index, ef_search=ef_search, nprobe=nprobe)
    k = max(1, k)
    scores, rows = index.search(q, min(k, max(1, index.ntotal)), params=params)
    return pad(scores, rows, k)


def pad(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """FAISS hits with missing ones (row -1) scored -inf, ties in row order, padded with such to ``k`` columns."""
    from twotower.retrieval.index.filtered import ties_in_row_order

    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    scores, rows = ties_in_row_order(scores, rows)
    if scores.shape[1] < k:
        extra = k - scores.shape[1]
        scores = np.pad(scores, ((0, 0), (0, extra)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, extra)), constant_values=-1)
    return scores, rows
