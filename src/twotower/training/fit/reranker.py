"""``twotower fit``'s optional last stage (``--reranker``): a cross-encoder trained on the train queries (never the
dev ones), re-ranking the retriever the select stage chose; its share in the blend with the first stage's scores is
chosen on dev among :data:`~twotower.training.fit.recipe.RERANK_WEIGHTS`, and it goes into the model only where it
raises the dev score (with cross-validation, where "dev" is one fold of a few dozen queries, only where it raises it
by cross-validation's bar: :func:`~twotower.training.fit.cv.held_out_gain`). A rerun without ``--reranker`` takes it
out of the model again (:func:`drop_reranker`).

Example::

    tt.fit("my-beir-dir", "fitted", reranker=True)  # fit.json: stages.rerank.kept, .weight, .dev_after
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

from twotower.retrieval.defaults import RetrievalDefaults, write_defaults
from twotower.training.fit import cv, select
from twotower.training.fit.recipe import RERANK_WEIGHTS


def train_ids(fit) -> set[str]:
    """The queries the cross-encoder learns from: the training part (never a dev query); with cross-validation
    every fold but the first, whose queries then choose its weight."""
    split = fit.split()
    if fit.cv:
        return set(split["train"]) - set(split["folds"][0])
    return set(split["train"])


def ensure_reranker(fit) -> tuple[Path, float]:
    """The fitted cross-encoder's directory (trained here unless an earlier run left it) and its training time."""
    from twotower.retrieval.rerank import RerankerTrainConfig, train_reranker

    r = fit.recipe
    ce_dir = fit.stages.dir("rerank") / "reranker"
    t0 = time.perf_counter()
    if not (ce_dir / "config.json").is_file():
        cfg = RerankerTrainConfig(epochs=r.reranker_epochs, negatives=r.reranker_negatives, lr=r.reranker_lr,
                                  seed=r.seed, precision=fit.opts.precision, device=fit.opts.device,
                                  show_progress=fit.opts.show_progress)
        train_reranker(fit.data, ce_dir, base=r.model, split=r.split, cfg=cfg, query_ids=train_ids(fit))
    return ce_dir, time.perf_counter() - t0


def _dev_runs(fit, chosen: dict) -> tuple[dict, dict]:
    """(qrels, first-stage run) the weight is chosen on: the dev split; with cross-validation the first fold's
    queries, ranked by the out-of-fold run of the chosen model (a model that never trained on them)."""
    import json

    r = fit.recipe
    qrels = fit.dev_qrels()
    dense, sparse = fit.dev_run(chosen["model"]) if not fit.cv else None, fit.bm25_dev()
    if fit.cv:
        held = set(fit.split()["folds"][0])
        qrels = {q: v for q, v in qrels.items() if q in held}
        dense = (fit.dev_run("zeroshot") if chosen["model"] == "zeroshot" else
                 json.loads((fit.out / "stages" / "cv" / "fold0" / "dev_run.json").read_text()))
        dense = {q: v for q, v in dense.items() if q in held}
        sparse = {q: v for q, v in sparse.items() if q in held}
    return qrels, select.fused(chosen["mode"], dense, sparse, chosen["lambda"], r.n_best, chosen.get("norm"))


def rerank_stage(fit) -> dict:
    """The stage's result: the dev scores before and after, the weight chosen, whether the re-ranker was kept (then
    in ``OUT/model/reranker``, named by the model's retrieval defaults), its training time and cost per query.
    ``fit``: the running fit (``run._Fit``: its recipe, options, stages, dev split and runs)."""
    from twotower.retrieval.rerank import Reranker, blend, ranking

    r = fit.recipe
    chosen = fit.chosen()
    qrels, base = _dev_runs(fit, chosen)
    ce_dir, train_s = ensure_reranker(fit)
    ce = Reranker(ce_dir, batch_size=fit.opts.batch_size or 32, precision=fit.opts.precision,
                  device=fit.opts.device)
    t0 = time.perf_counter()
    alone = ce.rerank(base, fit.ds.queries, fit.doc_text, top_n=r.rerank_depth,
                      show_progress=fit.opts.show_progress)
    per_query_ms = 1000 * (time.perf_counter() - t0) / max(1, len(base))
    top = {q: ranking(docs)[: r.rerank_depth] for q, docs in base.items()}  # the documents rerank re-scored

    def blended(w: float) -> dict:  # the cross-encoder's scores once, every blend from them
        return {q: blend(base[q], {d: alone[q][d] for d in top[q]}, w) for q in top}

    weights = {w: select.score(qrels, blended(w)) for w in RERANK_WEIGHTS}
    weight = max(weights, key=lambda w: (round(weights[w][r.metric], 10), w))  # a tie: more re-ranker
    before, after = select.score(qrels, base), weights[weight]
    kept, why = after[r.metric] > before[r.metric], None
    if fit.cv:  # a fold of a few dozen queries: the re-ranker must pay as every cross-validated departure does
        kept, why = cv.held_out_gain(qrels, blended(weight), base, r.metric)
    if kept:
        defaults = RetrievalDefaults(mode=chosen["mode"], lam=chosen["lambda"], rerank="reranker",
                                     norm=select.stored_norm(chosen), rerank_depth=r.rerank_depth,
                                     language=fit.bm25_language(), rerank_weight=None if weight == 1.0 else weight)
        shutil.copytree(ce_dir, fit.out / "model" / "reranker", dirs_exist_ok=True)
        write_defaults(fit.out / "model", defaults)
    return {"settings": r.rerank_settings(), "dev_before": before, "dev_after": after, "kept": kept,
            **({"why": why} if why else {}), "weight": weight, "dev_by_weight": {str(w): v for w, v in weights.items()},
            "train_s": round(train_s, 1), "rerank_ms_per_query": round(per_query_ms, 1), "depth": r.rerank_depth,
            "dev_queries": len(qrels), "trained_on_queries": len(train_ids(fit))}


def drop_reranker(out: Path) -> None:
    """Leave out a re-ranker an earlier run with ``--reranker`` put into the model."""
    from twotower.retrieval.defaults import read_defaults

    fitted = read_defaults(out / "model")
    if fitted is not None and fitted.rerank:
        write_defaults(out / "model", replace(fitted, rerank=None, rerank_weight=None))
        shutil.rmtree(out / "model" / fitted.rerank, ignore_errors=True)
