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

from twotower.checks import flag, given, naming
from twotower.errors import TwoTowerError


DEFAULT_WEIGHT = 1.0  # the feedback as much as the query
FEEDBACK_MODES = ("dense", "hybrid", "rrf")  # the retrievals with a dense query to move


def check_prf(depth: int | None, weight: float | None, *, mode: str | None = None, mode_option: str | None = None,
              fields: bool = False) -> None:
    """Refuse feedback settings that cannot be meant: a depth below 1, a weight not above 0 or not finite, a weight
    without a depth, or feedback for a ``mode`` without a dense query. The messages name the settings as the caller
    knows them (:func:`twotower.checks.option_name`): ``prf_depth=`` / ``mode=`` from Python, ``--prf-depth`` and
    ``mode_option`` (the command's flag for the mode when it is not ``--mode``: eval's ``--retriever``) on the command
    line; ``fields``: as a request's JSON fields (``"prf_depth"``), for the service."""
    if depth is None and weight is None:
        return

    def name(key: str, *value) -> str:  # the setting, with its value when one is given
        if fields:
            return " ".join([f'"{key}"', *map(str, value)])
        option = mode_option if key == "mode" else None
        return given(key, value[0], option) if value else flag(key, option)

    if depth is not None and depth < 1:
        raise TwoTowerError(f"{name('prf_depth', depth)}: the number of feedback documents must be 1 or more")
    if weight is not None and not (np.isfinite(weight) and weight > 0):
        raise TwoTowerError(f"{name('prf_weight', weight)}: the feedback weight must be a number above 0 "
                            f"(1 gives the query and its feedback equal shares)")
    if weight is not None and depth is None:
        raise TwoTowerError(f"{name('prf_weight')} needs {name('prf_depth')} (how many top documents feed back)")
    if mode is not None and mode not in FEEDBACK_MODES:
        modes = _modes(mode_option) if not fields else name("mode", " | ".join(FEEDBACK_MODES))
        raise TwoTowerError(f"{name('prf_depth')} feeds the top documents' vectors back into a dense query; "
                            f"{name('mode', mode)} has none: drop it or pass {modes}")


def _modes(option: str | None) -> str:
    """The feedback modes to choose from: ``mode='dense' | 'hybrid' | 'rrf'`` in Python, ``--retriever dense | hybrid |
    rrf`` on the command line (``option``: the mode's flag there)."""
    rest = FEEDBACK_MODES[1:] if naming() == "cli" else map(repr, FEEDBACK_MODES[1:])
    return " | ".join([given("mode", FEEDBACK_MODES[0], option), *rest])


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
                            f"(lower {flag('prf_depth')})")
    return top


def moved_queries(queries: np.ndarray, doc_vectors: np.ndarray, depth: int, weight: float) -> np.ndarray:
    """The query vectors after Rocchio feedback from their ``depth`` best documents by exact search."""
    from twotower.retrieval.dense import exact_search

    if depth > len(doc_vectors):
        raise TwoTowerError(f"{given('prf_depth', depth)}: the corpus has only {len(doc_vectors)} documents to feed "
                            f"back; lower {flag('prf_depth')}")
    _, first = exact_search(queries, doc_vectors, depth)
    return rocchio(queries, np.asarray(doc_vectors)[feedback_rows(first, depth)], weight)


def search_with_feedback(queries: np.ndarray, doc_vectors: np.ndarray, k: int, depth: int,
                         weight: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact search, Rocchio feedback from the ``depth`` best, exact search again: ``(scores, indices)``."""
    from twotower.retrieval.dense import exact_search

    return exact_search(moved_queries(queries, doc_vectors, depth, weight), doc_vectors, k)
