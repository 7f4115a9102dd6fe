"""Searching a binary index: the ``k × rescore_factor`` nearest documents by Hamming distance between sign
bits (a FAISS binary index, in RAM), rescored with the float query against the documents' int8 or fp32
vectors read from the memory-mapped ``vectors.npy`` (only the candidates' rows are read), or, with
``rescore="none"``, scored ``1 − 2·hamming / dim``."""

from __future__ import annotations

import numpy as np

from twotower.checks import flag
from twotower.retrieval.index.codecs import Codec, pack_bits
from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.kinds import widened


DEFAULT_EF_SEARCH = 128  # binary HNSW's efSearch when none is given (FAISS' own default, 16, lost NDCG@10: issue #44)


def hamming_params(index, ef_search: int | None, nprobe: int | None, sel=None, share: float = 1.0):
    """Per-call parameters of the Hamming search. An HNSW searched without ``ef_search`` gets
    :data:`DEFAULT_EF_SEARCH` (as Milvus' HNSW does), not FAISS' 16; ``sel`` (a FAISS ID selector: a filter) widens
    efSearch by 1 / ``share`` (the share of documents it lets through)."""
    import faiss

    if nprobe is not None:
        raise IndexStoreError("nprobe applies to IVF indexes; this index is a binary "
                              f"{type(index).__name__}: drop {flag('nprobe')}")
    hnsw = isinstance(index, faiss.IndexBinaryHNSW)
    if ef_search is not None and not hnsw:
        raise IndexStoreError(f"efSearch applies to HNSW indexes; this index is {type(index).__name__}: drop "
                              f"{flag('ef_search')}")
    base = int(ef_search) if ef_search is not None else DEFAULT_EF_SEARCH
    if sel is None:
        return faiss.SearchParametersHNSW(efSearch=base) if hnsw else None
    if hnsw:
        return faiss.SearchParametersHNSW(sel=sel, efSearch=widened(base, share))
    return faiss.SearchParameters(sel=sel)


def search_binary(
    index, queries: np.ndarray, k: int, codec: Codec, stored: np.ndarray, *, rescore_factor: int | None = None,
    ef_search: int | None = None, nprobe: int | None = None, sel=None, share: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, rows)``, each (n_queries, k), best first; row -1 / score -inf where fewer documents exist.
    ``queries``: float32 at the index's (cut) dimension; ``sel``: a FAISS ID selector (a metadata filter letting
    ``share`` of the documents through: :mod:`twotower.retrieval.index.filtered`)."""
    factor = codec.rescore_factor if rescore_factor is None else rescore_factor
    if factor < 1:
        raise IndexStoreError(f"rescore factor {factor}: must be at least 1")
    params = hamming_params(index, ef_search, nprobe, sel, share)
    rescore = codec.rescore != "none"
    depth = max(1, min(k * factor if rescore else k, index.ntotal))
    distances, rows = index.search(pack_bits(queries), depth, params=params)
    n = len(queries)
    scores_out = np.full((n, k), -np.inf, dtype=np.float32)
    rows_out = np.full((n, k), -1, dtype=np.int64)
    if not rescore:
        sims = 1.0 - 2.0 * distances.astype(np.float32) / codec.dim
        take = min(k, depth)
        scores_out[:, :take] = np.where(rows[:, :take] >= 0, sims[:, :take], -np.inf)
        rows_out[:, :take] = rows[:, :take]
        return scores_out, rows_out
    wanted = np.unique(rows[rows >= 0])
    vectors = codec.decode(stored[wanted]) if len(wanted) else np.empty((0, codec.dim), dtype=np.float32)
    for i in range(n):
        cand = rows[i][rows[i] >= 0]
        if not len(cand):
            continue
        sims = vectors[np.searchsorted(wanted, cand)] @ queries[i]
        order = np.argsort(-sims, kind="stable")[:k]  # ties keep the Hamming order
        scores_out[i, : len(order)] = sims[order]
        rows_out[i, : len(order)] = cand[order]
    return scores_out, rows_out
