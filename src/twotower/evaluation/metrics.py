"""Retrieval metrics with pytrec_eval, following BEIR's conventions.

- A retrieved document whose id equals the query id is dropped (BEIR's ``ignore_identical_ids``).
- MRR@10 is reciprocal rank over the top 10 only (pytrec_eval's ``recip_rank`` on the run cut to 10).
- Metrics are averaged over the queries that have judgements; a judged query with no retrieved
  documents counts as 0.
"""

from __future__ import annotations

import re

import numpy as np
import pytrec_eval

from twotower.checks import flag, naming

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
# other spellings of the same measures: trec_eval's (ndcg_cut_10, P_5, map_cut.100, recip_rank@10) and long names
_ALIASES = {"ndcg_cut": "ndcg", "precision": "p", "map_cut": "map", "recip_rank": "mrr", "accuracy": "acc"}
# name@k, name_k or name.k; the name is matched without regard to case, k is digits only (010 is 10)
_FORM = re.compile(r"\s*([A-Za-z_]+?)\s*(?:@|_|\.)\s*(-?\d+)\s*")  # a negative k: named as below 1
_SPELLINGS = ("ndcg@10, NDCG@10, ndcg_cut_10 and ndcg_cut.10 are one metric; names: ndcg, recall, p (precision), "
              "map, mrr (recip_rank), acc (accuracy)")


def _parse(metric: str) -> tuple[str, int]:
    """``(name, k)`` of a metric written ``name@k`` (any case; also trec_eval's ``ndcg_cut_10`` / ``P.5``)."""
    if not isinstance(metric, str):
        raise ValueError(f"metric {metric!r}: a name such as 'ndcg@10', not {type(metric).__name__}")
    match = _FORM.fullmatch(metric)
    if match is None:
        raise ValueError(f"metric '{metric}' must look like name@k, e.g. ndcg@10 ({_SPELLINGS})")
    name = match.group(1).lower()
    name = _ALIASES.get(name, name)
    if name not in _NAMES:
        raise ValueError(f"unknown metric '{metric}': use ndcg, recall, p, map, mrr or acc with @k ({_SPELLINGS})")
    cut = int(match.group(2))
    if cut < 1:  # pytrec_eval aborts the whole process on a cutoff below 1
        raise ValueError(f"metric '{metric}': the cutoff k must be at least 1, e.g. {name}@10")
    if cut > 2**31 - 1:  # past a C int pytrec_eval's measure string cannot be parsed
        raise ValueError(f"metric '{metric}': the cutoff k must be at most {2**31 - 1}")
    return name, cut


def canonical(metric: str) -> str:
    """The one spelling of ``metric``: ``NDCG@010`` and ``ndcg_cut_10`` are ``ndcg@10``."""
    name, cut = _parse(metric)
    return f"{name}@{cut}"


def check_metrics(metrics) -> None:
    """Raise ValueError, before any work, for an empty list, a metric that :func:`per_query` cannot compute, or
    one metric named twice in two spellings (``ndcg@10`` and ``NDCG@10``: both would be the key ``ndcg@10``)."""
    if isinstance(metrics, str) or not hasattr(metrics, "__iter__"):
        raise ValueError(f"metrics {metrics!r}: a list of names such as ['ndcg@10', 'recall@100']")
    metrics = list(metrics)
    if not metrics:
        example = "ndcg@10,recall@100" if naming() == "cli" else "['ndcg@10', 'recall@100']"
        raise ValueError(f"{flag('metrics')} names no metric: give e.g. {example}")
    seen: dict[str, str] = {}
    for metric in metrics:
        key = canonical(metric)
        if key in seen:
            raise ValueError(f"metrics '{seen[key]}' and '{metric}' are the same metric ({key}): give it once")
        seen[key] = metric


def _check_table(table, what: str, inner: str, valid, rule: str) -> None:
    """ValueError naming the first entry of ``table`` that is not ``{query_id: {doc_id: value}}`` with string ids
    and ``valid(value)``; ``inner`` names the value ("score", "grade") and ``rule`` says what it must be."""
    if not isinstance(table, dict):
        raise ValueError(f"{what}: a dict {{query_id: {{doc_id: {inner}}}}}, not {type(table).__name__}")
    for qid, docs in table.items():
        if not isinstance(qid, str):
            raise ValueError(f"{what}: query id {qid!r} is a {type(qid).__name__}; ids are strings")
        if not isinstance(docs, dict):
            raise ValueError(f"{what}[{qid!r}]: a dict {{doc_id: {inner}}}, not {type(docs).__name__}")
        for did, value in docs.items():
            if not isinstance(did, str):
                raise ValueError(f"{what}[{qid!r}]: document id {did!r} is a {type(did).__name__}; ids are strings")
            if isinstance(value, bool) or not valid(value):
                raise ValueError(f"{what}[{qid!r}][{did!r}] = {value!r}: {rule}")


def check_run(run, what: str = "run") -> None:
    """ValueError naming the first entry of ``run`` that is not ``{query_id: {doc_id: finite score}}``."""
    import math
    import numbers

    _check_table(run, what, "score", lambda v: isinstance(v, numbers.Real) and math.isfinite(v),
                 "a score is a finite number")


def check_qrels(qrels, what: str = "qrels") -> None:
    """ValueError naming the first judgement of ``qrels`` that is not ``{query_id: {doc_id: whole-number grade}}``
    (pytrec_eval takes integer grades only)."""
    import numbers

    _check_table(qrels, what, "grade", lambda v: isinstance(v, numbers.Integral) and abs(v) <= 2**31 - 1,
                 "a relevance grade is a whole number (0 not relevant, 1, 2, ... more relevant)")


def per_query(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, *, ignore_identical_ids: bool = True) -> dict[str, dict[str, float]]:
    """``{metric: {query_id: value}}`` for every judged query (missing ones scored 0), keyed by each metric's one
    spelling (:func:`canonical`: ``NDCG@010`` and ``ndcg_cut_10`` are both ``ndcg@10``)."""
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
        out[f"{name}@{cut}"] = values  # one key per metric, however it was spelt (canonical)
    return out


def evaluate(qrels: Qrels, run: Run, metrics=DEFAULT_METRICS, *, ignore_identical_ids: bool = True) -> dict[str, float]:
    """Mean of each metric over the judged queries."""
    pq = per_query(qrels, run, metrics, ignore_identical_ids=ignore_identical_ids)
    return mean_metrics(pq)


def mean_metrics(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over queries, from :func:`per_query`'s ``{metric: {query_id: value}}``."""
    return {m: float(np.mean(list(v.values()))) if v else 0.0 for m, v in scores.items()}
