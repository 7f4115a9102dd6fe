"""Scoring on dev and choosing the retriever: every candidate model's dense run, BM25's, and their fusions
(linear λ over a grid with min-max or z-score normalisation, RRF), each scored on the dev qrels; the best is kept
(ties: the simpler mode, then min-max, then λ nearest 0.5, then the earlier model). Pure functions over runs, so one
encoding of the corpus per model serves every λ. Without training labels: ``fit.label_free``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from twotower.evaluation.metrics import canonical, evaluate
from twotower.retrieval.dense import exact_search, to_run
from twotower.retrieval.hybrid import NORMS, interpolate, rrf

Run = dict[str, dict[str, float]]
MODE_ORDER = {"dense": 0, "hybrid": 1, "rrf": 2, "bm25": 3}


def dense_run(q_vecs: np.ndarray, doc_vecs: np.ndarray, qids: Sequence[str], doc_ids: Sequence[str],
              depth: int) -> Run:
    scores, idx = exact_search(q_vecs, doc_vecs, depth)
    return to_run(qids, doc_ids, scores, idx)


def fused(mode: str, dense: Run, sparse: Run, lam: float | None, n_best: int, norm: str | None = None) -> Run:
    """The run a retrieval choice gives (as eval's and the Searcher's fusions: same functions, same depths)."""
    if mode == "dense":
        return dense
    if mode == "bm25":
        return sparse
    if mode == "hybrid":
        return interpolate(dense, sparse, lam, n_best=n_best, top_k=n_best, norm=norm or "minmax")
    if mode == "rrf":
        return rrf([dense, sparse], n_best=n_best, top_k=n_best)
    raise ValueError(f"unknown mode {mode}")


def score(qrels, run: Run, metrics=("ndcg@10", "recall@100")) -> dict[str, float]:
    return {k: round(v, 4) for k, v in evaluate(qrels, run, metrics).items()}


def choose_retriever(
    dense_runs: Mapping[str, Run], sparse: Run, qrels, *, lambdas: Sequence[float], n_best: int, metric: str,
) -> tuple[dict, list[dict]]:
    """(best row, all rows): one row per (model, mode, λ, normalisation) with its dev ``metric`` and recall@100;
    the hybrid with each of :data:`NORMS` (min-max first: the simpler on a tie)."""
    rows = []
    for order, (name, dense) in enumerate(dense_runs.items()):
        options = [("dense", None, None)] + [("hybrid", float(x), n) for n in NORMS for x in lambdas] + [("rrf", None, None)]
        for mode, lam, norm in options:
            found = score(qrels, fused(mode, dense, sparse, lam, n_best, norm), (metric, "recall@100"))
            rows.append({"model": name, "mode": mode, "lambda": lam, "norm": norm, "dev": found, "_order": order})

    def key(row):
        lam_gap = abs(row["lambda"] - 0.5) if row["lambda"] is not None else 0.0
        norm_order = list(NORMS).index(row["norm"]) if row["norm"] else 0
        return (-round(row["dev"][canonical(metric)], 10), MODE_ORDER[row["mode"]], norm_order, lam_gap, row["_order"])

    best = min(rows, key=key)
    for row in rows:
        row.pop("_order")
    return best, rows


def stored_norm(row: dict) -> str | None:
    """The hybrid normalisation to store: z-score only (min-max is what a model without one gets)."""
    return row.get("norm") if row.get("norm") not in (None, "minmax") else None
