"""Retrieval metrics with pytrec_eval, following BEIR's conventions.

- A retrieved document whose id equals the query id is dropped (BEIR's ``ignore_identical_ids``).
- MRR@10 is reciprocal rank over the top 10 only (pytrec_eval's ``recip_rank`` on the run cut to 10).
- Metrics are averaged over the queries that have judgements; a judged query with no retrieved
  documents counts as 0.
"""

from __future__ import annotations

import numpy as np
import pytrec_eval

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

DEFAULT_METRICS = ("ndcg@10", "recall@100", "mrr@10", "p@1", "recall@1000")

_TREC = {"ndcg": "ndcg_cut", "recall": "recall", "p": "P", "map": "map_cut"}


def drop_identical_ids(run: Run) -> Run:
    return {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}


def top_n(run: Run, n: int) -> Run:
    """Keep each query's ``n`` best documents (ties broken by doc id, descending, as trec_eval)."""
    return {
        q: dict(sorted(docs.items(), key=lambda x: (x[1], x[0]), reverse=True)[:n]) for q, docs in run.items()
    }


_NAMES = ("ndcg", "recall", "p", "map", "mrr", "acc")


def _parse(metric: str) -> tuple[str, int]:
    try:
        name, cut_text = metric.lower().split("@")
        cut = int(cut_text)
    except ValueError:
        raise ValueError(f"metric '{metric}' must look like name@k, e.g. ndcg@10") from None
    if name not in _NAMES:
        raise ValueError(f"unknown metric '{metric}': use ndcg, recall, p, map, mrr or acc with @k")
    if cut < 1:  # pytrec_eval aborts the whole process on a cutoff below 1
        raise ValueError(f"metric '{metric}': the cutoff k must be at least 1, e.g. {name}@10")
    return name, cut


def check_metrics(metrics) -> None:
    """Raise ValueError, before any work, for an empty list or a metric that :func:`per_query` cannot compute."""
    if not metrics:
        raise ValueError("--metrics names no metric: give e.g. ndcg@10,recall@100")
    for metric in metrics:
        _parse(metric)


def per_query(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, *, ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    """``{metric: {query_id: value}}`` for every judged query (missing ones scored 0)."""
    if ignore_identical_ids:
        run = drop_identical_ids(run)
    judged = {q: rels for q, rels in qrels.items() if rels}
    out: dict[str, dict[str, float]] = {}
    for metric in metrics:
        name, cut = _parse(metric)
        values = {q: 0.0 for q in judged}
        if name in ("mrr", "acc"):
            cut_run = top_n(run, cut)
            if name == "mrr":
                res = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(cut_run)
                values.update({q: r["recip_rank"] for q, r in res.items()})
            else:  # top-k answer accuracy: any relevant document in the top k
                values.update({
                    q: float(any(judged[q].get(d, 0) > 0 for d in docs)) for q, docs in cut_run.items() if q in judged
                })
        elif name in _TREC:
            measure = f"{_TREC[name]}.{cut}" if name != "map" else f"map_cut.{cut}"
            key = f"{_TREC[name]}_{cut}"
            res = pytrec_eval.RelevanceEvaluator(judged, {measure}).evaluate(run)
            values.update({q: r[key] for q, r in res.items()})
        else:
            raise ValueError(f"unknown metric '{metric}': use ndcg, recall, p, map, mrr or acc with @k")
        out[metric] = values
    return out


def evaluate(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, *, ignore_identical_ids: bool = True) -> dict[str, float]:
    """Mean of each metric over the judged queries."""
    pq = per_query(qrels, run, metrics, ignore_identical_ids=ignore_identical_ids)
    return mean_metrics(pq)


def mean_metrics(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over queries, from :func:`per_query`'s ``{metric: {query_id: value}}``."""
    return {m: float(np.mean(list(v.values()))) if v else 0.0 for m, v in scores.items()}
