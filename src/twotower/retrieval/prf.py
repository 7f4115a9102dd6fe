"""Dense pseudo-relevance feedback: Rocchio on vectors.

Search once, move each query vector toward the mean of its ``depth`` best documents' vectors and search again
(Rocchio 1971 on dense vectors, as in Li et al. 2021, "Pseudo Relevance Feedback with Deep Language Models and
Dense Retrievers: Successes and Pitfalls"). No labels and no extra encoding: the feedback documents' vectors are
the ones already indexed. Where the corpus holds one answer in several languages (XQuAD-R's ``pool``), the
feedback pulls a query toward all of them; on a monolingual corpus it can as well drift away (measure it:
README, Multilingual).

    q' = (q + weight · mean(d_1 … d_depth)) / (1 + weight)

The denominator keeps scores on the scale of plain inner products (the ranking of one query does not depend on
it).
"""

from __future__ import annotations

import numpy as np

from twotower.errors import TwoTowerError


DEFAULT_WEIGHT = 1.0  # the feedback as much as the query
FEEDBACK_MODES = ("dense", "hybrid", "rrf")  # the retrievals with a dense query to move


def check_prf(depth: int | None, weight: float | None, *, mode: str | None = None, mode_option: str = "--retriever",
              depth_option: str = "--prf-depth", weight_option: str = "--prf-weight") -> None:
    """Refuse feedback settings that cannot be meant: a depth below 1, a weight not above 0 or not finite, a weight
    without a depth, or feedback for a ``mode`` (named by ``mode_option`` in the message) without a dense query."""
    if depth is None and weight is None:
        return
    if depth is not None and depth < 1:
        raise TwoTowerError(f"{depth_option} {depth}: the number of feedback documents must be 1 or more")
    if weight is not None and not (np.isfinite(weight) and weight > 0):
        raise TwoTowerError(f"{weight_option} {weight}: the feedback weight must be a number above 0 "
                            f"(1 gives the query and its feedback equal shares)")
    if weight is not None and depth is None:
        raise TwoTowerError(f"{weight_option} needs {depth_option} (how many top documents feed back)")
    if mode is not None and mode not in FEEDBACK_MODES:
        raise TwoTowerError(f"{depth_option} feeds the top documents' vectors back into a dense query; {mode_option} "
                            f"{mode} has none: drop it or pass {mode_option} {' | '.join(FEEDBACK_MODES)}")


def rocchio(queries: np.ndarray, feedback: np.ndarray, weight: float) -> np.ndarray:
    """Query vectors (n, dim) moved toward their feedback documents' vectors (n, depth, dim)."""
    if feedback.ndim != 3 or feedback.shape[0] != queries.shape[0] or feedback.shape[2] != queries.shape[1]:
        raise ValueError(f"feedback of shape {feedback.shape} does not match queries of shape {queries.shape}")
    q = queries.astype(np.float32) + weight * feedback.astype(np.float32).mean(axis=1)
    return q / (1.0 + weight)


def feedback_rows(rows: np.ndarray, depth: int) -> np.ndarray:
    """Each query's first ``depth`` result rows (a first search's ``indices``); rows < 0 (a search that found
    fewer) are refused, since their vectors do not exist."""
    top = rows[:, :depth]
    if (top < 0).any():
        raise TwoTowerError(f"pseudo-relevance feedback needs {depth} documents per query; a search returned fewer "
                            "(lower --prf-depth)")
    return top


def moved_queries(queries: np.ndarray, doc_vectors: np.ndarray, depth: int, weight: float) -> np.ndarray:
    """The query vectors after Rocchio feedback from their ``depth`` best documents by exact search."""
    from twotower.retrieval.dense import exact_search

    if depth > len(doc_vectors):
        raise TwoTowerError(f"--prf-depth {depth}: the corpus has only {len(doc_vectors)} documents to feed back; "
                            "lower --prf-depth")
    _, first = exact_search(queries, doc_vectors, depth)
    return rocchio(queries, np.asarray(doc_vectors)[feedback_rows(first, depth)], weight)


def search_with_feedback(queries: np.ndarray, doc_vectors: np.ndarray, k: int, depth: int,
                         weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact search, Rocchio feedback from the ``depth`` best, exact search again: ``(scores, indices)``."""
    from twotower.retrieval.dense import exact_search

    return exact_search(moved_queries(queries, doc_vectors, depth, weight), doc_vectors, k)
