"""Scoring on dev and choosing the retriever: every candidate model's dense run, BM25's, and their fusions
(linear λ over a grid with min-max or z-score normalisation, RRF), each scored on the dev qrels; the best is kept
(ties: the simpler mode, then min-max, then λ nearest 0.5, then the earlier model). Pure functions over runs, so one
encoding of the corpus per model serves every λ. Without training labels the choice comes from the languages alone
(:func:`label_free_choice`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from twotower.evaluation.metrics import evaluate
from twotower.retrieval.dense import exact_search, to_run
from twotower.retrieval.hybrid import NORMS, interpolate, rrf

Run = dict[str, dict[str, float]]
MODE_ORDER = {"dense": 0, "hybrid": 1, "rrf": 2}


def dense_run(q_vecs: np.ndarray, doc_vecs: np.ndarray, qids: Sequence[str], doc_ids: Sequence[str],
              depth: int) -> Run:
    scores, idx = exact_search(q_vecs, doc_vecs, depth)
    return to_run(qids, doc_ids, scores, idx)


def fused(mode: str, dense: Run, sparse: Run, lam: float | None, n_best: int, norm: str | None = None) -> Run:
    """The run a retrieval choice gives (as eval's and the Searcher's fusions: same functions, same depths)."""
    if mode == "dense":
        return dense
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
        return (-round(row["dev"][metric], 10), MODE_ORDER[row["mode"]], norm_order, lam_gap, row["_order"])

    best = min(rows, key=key)
    for row in rows:
        row.pop("_order")
    return best, rows


# The hybrid's λ without labels for a multilingual encoder on one-language data: chosen on XQuAD-R's dev half over
# its 11 monolingual sets with multilingual-e5-small (benchmarks/results/multilingual_fusion.md: 0.6, held-out half
# 0.8530 vs 0.8503 at 0.5); at 0.5 German fell below dense alone (0.8462 vs 0.8477), at 0.6 none of the 11 does.
MULTILINGUAL_LAMBDA = 0.6


def label_free_retriever(doc_language: str, query_language: str, encoder_languages: Sequence[str] | None,
                         lam: float) -> tuple[str, float | None, str]:
    """(mode, λ, why) for data with no training labels, from what is known without them: the languages of the
    documents and of the queries (``analyzers.detect_language``; ``multi``: mixed or undetermined) and the ones
    the encoder was trained on (``registry.model_languages``; None: unknown, ``multi``: many, in one space).
    An unknown encoder, or languages that could not be told, give the hybrid at the default ``lam`` (no basis for
    anything else).

    - an encoder trained on other languages than the data's (both determined): BM25 alone — an English-only
      encoder pulls a hybrid below BM25 on other languages (XQuAD-R zh: 0.757 vs 0.817 NDCG@10);
    - queries in another language than the documents, or mixed, with a multilingual encoder: dense alone —
      BM25 cannot match words across languages and drags a fusion down (XQuAD-R pool mAP: hybrid 0.187, dense 0.299);
    - one language and a multilingual encoder: the hybrid at :data:`MULTILINGUAL_LAMBDA` (such an encoder is the
      stronger side outside English, where BM25's stemmers are weaker);
    - otherwise the hybrid at the default ``lam``."""
    langs = {doc_language, query_language}
    if encoder_languages is None:
        return "hybrid", lam, f"hybrid retrieval at the default λ {lam} (the encoder's languages are not known)"
    multilingual = "multi" in encoder_languages
    if not multilingual and "multi" not in langs and not langs <= set(encoder_languages):
        return "bm25", None, (f"the encoder was trained on {'/'.join(encoder_languages)} text only and the data is "
                              f"{'/'.join(sorted(langs))}: BM25 alone")
    if multilingual and (len(langs) > 1 or "multi" in langs):
        return "dense", None, (f"queries ({query_language}) and documents ({doc_language}) are not in one language: "
                               "BM25 cannot match words across languages, dense alone")
    if multilingual:
        return "hybrid", MULTILINGUAL_LAMBDA, (f"hybrid retrieval at λ {MULTILINGUAL_LAMBDA} (a multilingual encoder on "
                                               f"{doc_language} text)")
    return "hybrid", lam, f"hybrid retrieval at the default λ {lam}"


def label_free_choice(data, model: str | None, doc_language: str, lam: float) -> tuple[str, float | None, str, str]:
    """(mode, λ, why, the queries' language) for the BEIR directory ``data`` without training labels:
    :func:`label_free_retriever` on the detected query language and ``model``'s languages."""
    from pathlib import Path

    from twotower.data.beir import load_queries
    from twotower.encoders.registry import model_languages
    from twotower.retrieval.analyzers import detect_language

    query_language = detect_language(list(load_queries(Path(data) / "queries.jsonl").values()))
    mode, lam_out, why = label_free_retriever(doc_language, query_language, model_languages(model), lam)
    return mode, lam_out, why, query_language
