"""Exact inner-product search over a matrix of document vectors, in bounded memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

Run = dict[str, dict[str, float]]


def exact_search(
    queries: np.ndarray,
    docs: np.ndarray,
    k: int,
    *,
    doc_chunk: int = 65536,
    query_chunk: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` inner products of each query against all documents.

    Scores are computed chunk by chunk (at most ``query_chunk`` × ``doc_chunk`` floats at a time)
    and merged into a running top-k. Returns ``(scores, indices)``, each (n_queries, k'), best
    first, with k' = min(k, n_docs).
    """
    if queries.ndim != 2 or docs.ndim != 2:
        raise ValueError("queries and docs must be 2-d arrays")
    if queries.shape[1] != docs.shape[1]:
        raise ValueError(f"dimension mismatch: queries have {queries.shape[1]}, documents {docs.shape[1]}")
    k = min(k, docs.shape[0])
    q_all = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    d_all = torch.from_numpy(np.ascontiguousarray(docs, dtype=np.float32))
    out_scores = np.empty((len(queries), k), dtype=np.float32)
    out_idx = np.empty((len(queries), k), dtype=np.int64)
    with torch.inference_mode():
        for qs in range(0, len(queries), query_chunk):
            q = q_all[qs : qs + query_chunk]
            best_s = torch.full((len(q), 0), float("-inf"))
            best_i = torch.empty((len(q), 0), dtype=torch.long)
            for ds in range(0, len(docs), doc_chunk):
                scores = q @ d_all[ds : ds + doc_chunk].T
                top = min(k, scores.shape[1])
                s, i = torch.topk(scores, top, dim=1)
                best_s = torch.cat([best_s, s], dim=1)
                best_i = torch.cat([best_i, i + ds], dim=1)
                if best_s.shape[1] > k:
                    best_s, pos = torch.topk(best_s, k, dim=1)
                    best_i = torch.gather(best_i, 1, pos)
            out_scores[qs : qs + len(q)] = best_s.numpy()
            out_idx[qs : qs + len(q)] = best_i.numpy()
    return out_scores, out_idx


def to_run(query_ids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray, indices: np.ndarray) -> Run:
    """Turn search output into ``{query_id: {doc_id: score}}``."""
    return {
        qid: {doc_ids[j]: float(s) for s, j in zip(row_s, row_i)}
        for qid, row_s, row_i in zip(query_ids, scores, indices)
    }
