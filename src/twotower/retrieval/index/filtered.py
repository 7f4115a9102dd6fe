"""Dense search restricted to the documents a filter lets through (a boolean row mask): pre-filtering, never a
top-k cut after the fact.

How, by index kind and by the share of documents that match (the *selectivity*):

- **Few match** (at most :data:`EXACT_SHARE` of the documents, or at most :data:`EXACT_ROWS`, or too few for an ANN
  search to fill ``k``): the matching rows' stored vectors are scored exactly (decoded from fp16 / int8 / bits) —
  the cost follows the number of matches, not of documents. Exact for every kind.
- **Flat** (exact) indexes otherwise: FAISS searches with an ``IDSelectorBitmap`` over the rows (it skips the
  others: no slower than an unfiltered search). Exact: the true top ``k`` over the matching documents, never fewer
  than ``min(k, matches)``.
- **HNSW / IVF** otherwise: FAISS with the selector and a widened search, ``efSearch`` (or ``nprobe``) divided by
  the selectivity (capped at :data:`MAX_EF` / the number of lists; HNSW without ``ef_search`` starts from at least
  :data:`FILTERED_EF_BASE`); a query that still gets fewer than
  ``min(k, matches)`` hits is answered exactly. Recall is the ANN's at that breadth (the filters benchmark measures
  it); the hits are always matching documents.
- **Binary** (Hamming) indexes otherwise: the Hamming search runs with the selector over ``k × rescore_factor``
  candidates, rescored as unfiltered searches are.
- **Several rows a document** (passages, ME-BERT): the selector covers every vector row of a matching document
  (through the offsets); candidates reduce to documents and are rescored exactly, as unfiltered (:mod:`.grouped`).
"""

from __future__ import annotations

import numpy as np

from twotower.retrieval.index.kinds import MAX_EF, widened  # noqa: F401  (MAX_EF: the cap the docstring names)

EXACT_SHARE = 0.01  # at most this share of documents matching: exact scoring of the matches
EXACT_ROWS = 2_000  # ... or at most this many matching documents (also on small indexes)
# a filtered HNSW search without ef_search starts from at least this efSearch before widening by 1 / share: FAISS'
# default (16) widened kept recall@10 0.934 at 5% on 105k documents, 32 gave 0.978 (benchmarks/filters.py,
# results/filters_hnsw100k)
FILTERED_EF_BASE = 32
_CHUNK = 65_536


def empty(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


def exact(store, q: np.ndarray, k: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The true top ``k`` of ``rows`` (document rows, ascending) for each query in ``q`` (projected): inner
    products with the stored vectors (a document's best vector for multi-vector indexes), equal scores in row
    order. Queries go 32 at a time (a score matrix of 32 × matches at most)."""
    out_s, out_r = empty(len(q), k)
    take = min(k, len(rows))
    for qs in range(0, len(q), 32):
        block_q = q[qs : qs + 32]
        scores = np.empty((len(block_q), len(rows)), dtype=np.float32)
        for s in range(0, len(rows), _CHUNK):
            block = rows[s : s + _CHUNK]
            if store.offsets is None:
                scores[:, s : s + len(block)] = block_q @ store.float_vectors(block).T
            else:
                from twotower.retrieval.index.grouped import maxsim_scores

                from twotower.retrieval.index.grouped import first_only

                scores[:, s : s + len(block)] = maxsim_scores(block_q, store.vectors, store.offsets, block,
                                                              store.codec.decode, first_only(store))
        for i, row_scores in enumerate(scores):
            best = np.argpartition(-row_scores, take - 1)[:take] if len(rows) > 4 * take else np.arange(len(rows))
            order = best[np.lexsort((best, -row_scores[best]))][:take]  # best first, equal scores by row
            out_s[qs + i, :take] = row_scores[order]
            out_r[qs + i, :take] = rows[order]
    return out_s, out_r


def ties_in_row_order(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each query's hits best first, equal scores in ascending row order (FAISS returns the right rows, lowest
    first among ties at the cut, but in its heap's order): every search path orders ties as exact search does."""
    order = np.lexsort((rows, -scores), axis=-1)
    return np.take_along_axis(scores, order, axis=-1), np.take_along_axis(rows, order, axis=-1)


def _selector(mask: np.ndarray):
    import faiss

    bits = np.packbits(mask, bitorder="little")
    sel = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(bits))
    sel._bits = bits  # the bitmap must outlive the selector
    return sel


def _params(store, index, sel, ef_search, nprobe, share: float):
    """FAISS search parameters with ``sel``, the ANN breadth widened by 1 / ``share``."""
    import faiss

    from twotower.retrieval.index.kinds import find

    inner = faiss.downcast_index(index)
    pre = isinstance(inner, faiss.IndexPreTransform)
    hnsw = find(index, "IndexHNSW") if not store.codec.vectors == "binary" else None
    ivf = faiss.try_extract_index_ivf(index) if not store.codec.vectors == "binary" else None
    if hnsw is not None:
        base = ef_search or max(FILTERED_EF_BASE, faiss.downcast_index(hnsw).hnsw.efSearch)
        params = faiss.SearchParametersHNSW(sel=sel, efSearch=widened(base, share))
    elif ivf is not None:
        base = nprobe or ivf.nprobe
        params = faiss.SearchParametersIVF(sel=sel, nprobe=widened(base, share, cap=ivf.nlist))
    else:
        params = faiss.SearchParameters(sel=sel)
    if pre:
        sel_params, params = params, faiss.SearchParametersPreTransform(index_params=params)
        params._keep = sel_params
    return params


def search_masked(store, q: np.ndarray, k: int, mask: np.ndarray, *, ef_search: int | None = None,
                  nprobe: int | None = None, candidates: int | None = None,
                  rescore_factor: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, rows)``, each (n_queries, k), over the documents where ``mask`` (bool, one per document row) is
    True; ``q``: projected query vectors. Rows -1 / scores -inf pad when fewer than ``k`` documents match."""
    from twotower.retrieval.index.kinds import search_params

    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (len(store),):
        raise ValueError(f"a filter mask needs {len(store)} entries, got {mask.shape}")
    rows = np.flatnonzero(mask)
    n_match = len(rows)
    if n_match == 0:
        return empty(len(q), k)
    share = n_match / len(store)
    search_params(store.faiss_index, ef_search=ef_search, nprobe=nprobe)  # the user's options checked as unfiltered
    if n_match <= max(EXACT_ROWS, EXACT_SHARE * len(store)) or n_match <= k:
        return exact(store, q, k, rows)
    index = store.faiss_index
    if store.offsets is None:
        sel = _selector(mask)
        if store.codec.vectors == "binary":
            from twotower.retrieval.index.binary import search_binary

            scores, out = search_binary(index, q, k, store.codec, store.vectors, rescore_factor=rescore_factor,
                                        ef_search=ef_search, nprobe=nprobe, sel=sel, share=share)
        else:
            scores, out = index.search(q, k, params=_params(store, index, sel, ef_search, nprobe, share))
    else:  # passages or ME-BERT: the selector covers every row of a matching document
        from twotower.retrieval.index.grouped import row_mask, search_grouped

        rows_seen = row_mask(store, mask)
        sel, share = _selector(rows_seen), max(float(rows_seen.mean()), 1e-9)  # the share of vector rows let through
        params = None if store.codec.vectors == "binary" else _params(store, index, sel, ef_search, nprobe, share)
        scores, out = search_grouped(store, q, k, ef_search=ef_search, nprobe=nprobe, candidates=candidates,
                                     rescore_factor=rescore_factor, sel=sel, share=share, params=params,
                                     matching=n_match)
    scores = np.where(out < 0, -np.inf, scores).astype(np.float32)
    short = np.flatnonzero((out >= 0).sum(axis=1) < min(k, n_match))
    if len(short):  # the widened ANN search still came back short: those queries exactly
        scores[short], out[short] = exact(store, q[short], k, rows)
    return ties_in_row_order(scores, out.astype(np.int64))  # equal scores by row, as exact() gives them
