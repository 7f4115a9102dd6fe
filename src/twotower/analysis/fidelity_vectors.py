"""BM25 as an inner product, the normalized margin and random projections: the formulas under
``twotower analyze fidelity`` (:mod:`twotower.analysis.fidelity`, Luan et al. §2).

With the Lucene BM25 that ``twotower.retrieval.bm25.BM25`` (bm25s) uses, score(q, d) = ⟨q, d⟩ with the query vector
q_t = idf_t · c_t(q) and the document vector d_t = tf_{t,d} / (tf_{t,d} + k1·(1 − b + b·|d|/avgdl)), built with scipy
from the same tokenization as our BM25 (a unit test checks ⟨q, d⟩ against ``BM25.search``). The normalized margin is
μ(q, d1, d2) = ⟨q, d1 − d2⟩ / (‖q‖·‖d1 − d2‖); a random projection A ∈ R^{k×v} (Gaussian N(0, 1/k) or Rademacher
±1/√k) keeps d1 over d2 with probability ≥ 1 − β once k ≥ 2·(ε²/2 − ε³/3)⁻¹·ln(4/β) (ε = μ): :func:`bound_k`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


PROJECTIONS = ("gaussian", "rademacher")


# ----------------------------------------------------------------------------- formulas


def margin_x(eps: float | np.ndarray) -> float | np.ndarray:
    """(ε²/2 − ε³/3)⁻¹, the quantity k* grows with; ε in (0, 1]."""
    eps = np.asarray(eps, dtype=np.float64)
    out = 1.0 / (eps**2 / 2.0 - eps**3 / 3.0)
    return float(out) if out.ndim == 0 else out


def bound_k(eps: float | np.ndarray, beta: float = 0.05) -> float | np.ndarray:
    """The JL-style bound k* ≤ 2·(ε²/2 − ε³/3)⁻¹·ln(4/β) on the dimension that keeps a pair's order
    with probability ≥ 1 − β."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return 2.0 * margin_x(eps) * math.log(4.0 / beta)


def normalized_margin(q, d1, d2) -> float:
    """μ(q, d1, d2) = ⟨q, d1 − d2⟩ / (‖q‖·‖d1 − d2‖) for 1-d arrays or 1×v sparse rows.

    NaN when q = 0 or d1 = d2 (the margin is undefined).
    """

    def dense(v) -> np.ndarray:
        return np.asarray(v.toarray() if sp.issparse(v) else v, dtype=np.float64).ravel()

    q, diff = dense(q), dense(d1) - dense(d2)
    denom = np.linalg.norm(q) * np.linalg.norm(diff)
    return float(q @ diff / denom) if denom > 0 else float("nan")


def projection_block(kind: str, v: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` unscaled projection rows as a (v, n) float32 block: N(0, 1) or ±1 entries.

    Divided by √k these are rows of A (see :func:`projection_matrix`).
    """
    if kind == "gaussian":
        return rng.standard_normal((v, n), dtype=np.float32)
    if kind == "rademacher":
        return (rng.integers(0, 2, size=(v, n), dtype=np.int8) * 2 - 1).astype(np.float32)
    raise ValueError(f"unknown projection '{kind}': choose one of {', '.join(PROJECTIONS)}")


def projection_matrix(kind: str, k: int, v: int, rng: np.random.Generator) -> np.ndarray:
    """A ∈ R^{k×v} with entries N(0, 1/k) (``gaussian``) or ±1/√k (``rademacher``): E‖Ax‖² = ‖x‖²."""
    return projection_block(kind, v, k, rng).T / np.float32(math.sqrt(k))


# ----------------------------------------------------------------------------- BM25 vectors


@dataclass
class BM25Vectors:
    """BM25 as sparse vectors whose inner products are the BM25 scores (see the module doc)."""

    queries: sp.csr_matrix  # (n_queries, v): idf_t × count of t in the query
    docs: sp.csr_matrix  # (n_docs, v): tf / (tf + k1·(1 − b + b·|d|/avgdl))
    idf: np.ndarray  # (v,), 0 for terms absent from the collection
    doc_lengths: np.ndarray  # (n_docs,) analysed tokens per (truncated) document


def _count_matrix(token_lists: Sequence[Sequence[int]], vocab_size: int) -> sp.csr_matrix:
    lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = (np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
               if lengths.sum() else np.empty(0, dtype=np.int64))
    m = sp.csr_matrix((np.ones(len(indices), dtype=np.float64), indices, indptr),
                      shape=(len(token_lists), vocab_size))
    m.sum_duplicates()
    return m


def bm25_vectors(
    doc_tokens: Sequence[Sequence[int]],
    query_tokens: Sequence[Sequence[int]],
    vocab_size: int,
    *,
    k1: float = 1.5,
    b: float = 0.75,
    max_doc_tokens: int | None = None,
) -> BM25Vectors:
    """Lucene BM25 query/document vectors from token ids (bm25s tokenizer output)."""
    if max_doc_tokens is not None:
        doc_tokens = [t[:max_doc_tokens] for t in doc_tokens]
    tf = _count_matrix(doc_tokens, vocab_size)
    lengths = np.fromiter((len(t) for t in doc_tokens), dtype=np.float64, count=len(doc_tokens))
    n_docs = tf.shape[0]
    avgdl = lengths.mean() if n_docs else 0.0
    df = np.bincount(tf.indices, minlength=vocab_size).astype(np.float64)
    idf = np.where(df > 0, np.log1p((n_docs - df + 0.5) / (df + 0.5)), 0.0)
    norm = k1 * (1.0 - b + b * lengths / avgdl) if avgdl > 0 else np.full(n_docs, k1)
    rows = np.repeat(np.arange(n_docs), np.diff(tf.indptr))
    docs = tf.copy()
    docs.data = tf.data / (tf.data + norm[rows])
    qc = _count_matrix(query_tokens, vocab_size)
    queries = (qc @ sp.diags(idf)).tocsr()
    queries.eliminate_zeros()
    return BM25Vectors(queries=queries, docs=docs.tocsr(), idf=idf, doc_lengths=lengths.astype(np.int64))


def _row_norms(m: sp.csr_matrix) -> np.ndarray:
    return np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())


def margins_to_all(vecs: BM25Vectors, top1: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """μ(q_i, d_top1[i], d_j) for every query i and document j: (n_queries, n_docs), NaN at j = top1[i]
    and wherever d_j = d_top1[i]."""
    q_norm = _row_norms(vecs.queries)
    d_sq = _row_norms(vecs.docs) ** 2
    cross = (vecs.docs[top1] @ vecs.docs.T).toarray()  # ⟨d1, d_j⟩
    diff_sq = np.maximum(d_sq[top1][:, None] + d_sq[None, :] - 2.0 * cross, 0.0)
    s1 = scores[np.arange(len(top1)), top1]
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = (s1[:, None] - scores) / (q_norm[:, None] * np.sqrt(diff_sq))
    mu[np.arange(len(top1)), top1] = np.nan
    mu[diff_sq <= 1e-12 * np.maximum(d_sq[top1][:, None], 1e-30)] = np.nan
    return mu
