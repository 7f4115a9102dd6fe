"""Sparse–dense fusion as small pure functions over runs ``{query_id: {doc_id: score}}``.

- :func:`interpolate`: Luan et al.'s hybrid, score = λ·dense + (1 − λ)·sparse over the union of
  each system's n-best, each run normalised per query first — min-max (the default) or z-score (``norm``;
  Bruch et al. 2023 compare the two) — a document missing from one system's n-best gets that system's
  minimum (0 after min-max).
- :func:`rrf`: reciprocal rank fusion, Σ 1 / (k + rank), rank from 1 (Cormack et al.; k = 60).
- ``top_k`` on both cuts the fused ranking; to get ``top_k`` documents, fuse runs retrieved (and pass
  ``n_best``) at least that deep: :func:`fusion_depth`.
- :func:`dev_split` holds out part of a *train* split's queries to tune λ on, so the test split is never looked
  at; the tuning scores runs with the evaluation's metrics, so it lives there:
  :func:`twotower.evaluation.tuning.tune_lambda`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

Run = dict[str, dict[str, float]]


def truncate(run: Run, n: int | None) -> Run:
    """Each query's ``n`` best documents (all when ``n`` is None)."""
    if n is None:
        return {q: dict(docs) for q, docs in run.items()}
    return {q: dict(sorted(docs.items(), key=lambda kv: kv[1], reverse=True)[:n]) for q, docs in run.items()}


def minmax(run: Run) -> Run:
    """Per-query min-max normalisation to [0, 1] (all scores 1.0 when a query's scores are equal)."""
    out: Run = {}
    for q, docs in run.items():
        if not docs:
            out[q] = {}
            continue
        lo, hi = min(docs.values()), max(docs.values())
        span = hi - lo
        out[q] = {d: (s - lo) / span if span > 0 else 1.0 for d, s in docs.items()}
    return out


def zscores(docs: Mapping[str, float]) -> dict[str, float]:
    """One query's z-scores: (s − mean) / standard deviation over its documents (0 when they are equal)."""
    n = len(docs)
    mean = sum(docs.values()) / n if n else 0.0
    sd = (sum((s - mean) ** 2 for s in docs.values()) / n) ** 0.5 if n else 0.0
    return {d: (s - mean) / sd if sd > 0 else 0.0 for d, s in docs.items()}


def zscore(run: Run) -> Run:
    """Per-query z-scores (:func:`zscores`)."""
    return {q: zscores(docs) for q, docs in run.items()}


NORMS = {"minmax": minmax, "zscore": zscore}


def fusion_depth(top_k: int, n_best: int) -> int:
    """How deep each side of a fusion is retrieved and fused so that ``top_k`` fused documents exist:
    the tuned ``n_best``, or ``top_k`` when that is deeper."""
    return max(top_k, n_best)


def interpolate(
    dense: Run, sparse: Run, lam: float, *, n_best: int | None = None, normalize: bool = True,
    top_k: int | None = None, norm: str = "minmax",
) -> Run:
    """λ·dense + (1 − λ)·sparse over the union of both n-bests (per query; queries of either run), each run
    normalised per query by ``norm`` (:data:`NORMS`) unless ``normalize`` is False, each query's fused ranking cut
    to its ``top_k`` best (all when None)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    if norm not in NORMS:
        raise ValueError(f"unknown fusion normalisation '{norm}': choose one of {', '.join(NORMS)}")
    d_run, s_run = truncate(dense, n_best), truncate(sparse, n_best)
    if normalize:
        d_run, s_run = NORMS[norm](d_run), NORMS[norm](s_run)
    floor_is_zero = normalize and norm == "minmax"
    fused: Run = {}
    for q in dict.fromkeys([*d_run, *s_run]):
        d, s = d_run.get(q, {}), s_run.get(q, {})
        d_floor = min(d.values(), default=0.0) if not floor_is_zero else 0.0
        s_floor = min(s.values(), default=0.0) if not floor_is_zero else 0.0
        fused[q] = {
            doc: lam * d.get(doc, d_floor) + (1.0 - lam) * s.get(doc, s_floor) for doc in dict.fromkeys([*d, *s])
        }
    return fused if top_k is None else truncate(fused, top_k)


def rrf(
    runs: Sequence[Run], *, k: int = 60, n_best: int | None = None, weights: Sequence[float] | None = None,
    top_k: int | None = None,
) -> Run:
    """Reciprocal rank fusion: Σ_r w_r / (k + rank_r(doc)) over the runs that retrieved doc (each cut to its
    ``n_best``), each query's fused ranking cut to its ``top_k`` best (all when None)."""
    if weights is not None and len(weights) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(weights)} weights")
    weights = weights or [1.0] * len(runs)
    fused: Run = {}
    for run, w in zip(runs, weights):
        for q, docs in truncate(run, n_best).items():
            ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))
            target = fused.setdefault(q, {})
            for rank, (doc, _) in enumerate(ranked, start=1):
                target[doc] = target.get(doc, 0.0) + w / (k + rank)
    return fused if top_k is None else truncate(fused, top_k)


def dev_split(query_ids: Iterable[str], fraction: float = 0.5, seed: int = 0) -> tuple[list[str], list[str]]:
    """Split query ids into ``(dev, rest)`` reproducibly; ``dev`` gets ``fraction`` of them."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    ids = sorted(query_ids)
    random.Random(seed).shuffle(ids)
    cut = max(1, round(len(ids) * fraction))
    return sorted(ids[:cut]), sorted(ids[cut:])
