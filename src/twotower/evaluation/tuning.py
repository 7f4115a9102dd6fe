"""Tuning the hybrid's λ on dev queries: :func:`tune_lambda` scores each fusion
(:func:`twotower.retrieval.hybrid.interpolate`) with the evaluation's metrics and keeps the best."""

from __future__ import annotations

from collections.abc import Sequence

from twotower.evaluation.metrics import Qrels, Run, canonical, evaluate
from twotower.retrieval.hybrid import interpolate


def tune_lambda(
    dense: Run,
    sparse: Run,
    qrels: Qrels,
    *,
    grid: Sequence[float] = tuple(i / 20 for i in range(21)),
    metric: str = "ndcg@10",
    n_best: int | None = 100,
) -> tuple[float, dict[float, float]]:
    """The λ in ``grid`` with the best ``metric`` on ``qrels`` (ties: the λ closest to 0.5).

    Only queries in ``qrels`` count, so pass dev qrels (never test ones). Returns
    ``(best λ, {λ: metric})``.
    """
    qids = set(qrels)
    d = {q: v for q, v in dense.items() if q in qids}
    s = {q: v for q, v in sparse.items() if q in qids}
    if not d and not s:
        raise ValueError("no query of the runs is judged in the given qrels")
    table = {lam: evaluate(qrels, interpolate(d, s, lam, n_best=n_best), (metric,))[canonical(metric)] for lam in grid}
    best = max(table, key=lambda lam: (round(table[lam], 10), -abs(lam - 0.5)))
    return best, table
