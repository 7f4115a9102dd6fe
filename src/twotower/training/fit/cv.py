"""``twotower fit``'s choices by k-fold cross-validation, for data with few judged queries (below
``recipe.cv_below``): one dev split of a few dozen queries is mostly noise (one query moves NDCG@10 by 0.02), and
it keeps a fifth of the few labels from ever training the final model.

How, within the single split's time:

- the judged queries are cut into ``recipe.cv_folds`` seeded folds, by query id;
- the *cheap* choices (mode, λ, normalisation) are made over fixed runs: every candidate retrieval setting is
  scored on each fold's queries, so a setting's mean and spread over folds cost no encoding at all;
- for the *model* choice (zero-shot or fine-tuned) each fold gets a model fine-tuned on the other folds, and that
  model ranks only its own held-out queries' candidate pool (their zero-shot dense and BM25 top ``n_best``: the
  documents a fusion of n_best-deep runs can return) instead of the whole corpus (where the pools hold more than
  half the corpus, the whole corpus, exactly: never more than one corpus encoding per fold). Its runs are out-of-fold: no
  query is ever scored by a model that trained on it. A relevant document outside the pool can only be missed,
  so the estimate is never in the fine-tuned model's favour;
- the mined-negative retraining is not a candidate here (its mining needs each fold model's ranking of its
  training queries over the corpus); with few queries it is the fine-tune's second round that has least to add.

The rule (:func:`decide`): every departure from what fit does without labels must pay for itself. The default
zero-shot retrieval (what fit chooses without labels, ``label_free``: the hybrid at λ 0.5, min-max; BM25 alone where
the encoder does not know the data's language — XQuAD-R es with the English MiniLM: BM25 0.8059 test NDCG@10, the
hybrid at λ 0.5 0.7445, which cross-validation had kept as its default) stays unless another zero-shot setting beats
it by at least :data:`MIN_GAIN` (0.02) on average over the folds *and* by more than the spread of their per-fold differences (mean
gain > sample standard deviation of the gain over the folds) *and* by more than :data:`MIN_T` standard errors of
the mean per-query gain; that zero-shot choice stays unless the best
fine-tuned setting beats it the same way: fit never trades a sure zero-shot score for a gain the folds cannot tell
from noise. The least gain is there because the best of ~80 candidates beats the default on a few folds by luck
(the spread, from 3 folds, does not see that it was picked as the best of many). The final model then trains on
every judged query with the chosen settings.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from twotower.evaluation.metrics import canonical, per_query
from twotower.retrieval.searcher import DEFAULT_LAMBDA
from twotower.training.fit import select

Run = dict[str, dict[str, float]]


def make_folds(query_ids, k: int, seed: int) -> list[list[str]]:
    """``k`` folds of the judged query ids: a seeded shuffle of the sorted ids dealt round-robin (sizes differ by at
    most one; the same ids and seed always give the same folds)."""
    ids = sorted(set(query_ids))
    random.Random(seed).shuffle(ids)
    return [sorted(ids[i::k]) for i in range(k)]


def use_cv(n_queries: int, cv_below: int, k: int) -> bool:
    """Cross-validate when there are fewer than ``cv_below`` judged queries and at least 2 per fold."""
    return n_queries < cv_below and n_queries >= 2 * k


def candidate_pool(runs: Sequence[Run], qid: str, depth: int) -> set[str]:
    """The documents of ``qid`` in any of ``runs``' top ``depth``."""
    pool: set[str] = set()
    for run in runs:
        docs = run.get(qid, {})
        pool.update(sorted(docs, key=lambda d: (-docs[d], d))[:depth])
    return pool


def pooled_run(q_vecs: np.ndarray, qids: Sequence[str], pools: Mapping[str, set[str]],
               doc_vecs: Mapping[str, np.ndarray], depth: int) -> Run:
    """Each query's dense run (its ``depth`` best) over its own pool, from the pool's vectors ``doc_vecs`` (a
    document's vector, or its passages' vectors: then it scores as its best passage)."""
    run: Run = {}
    for i, q in enumerate(qids):
        ids = sorted(pools[q])
        if not ids:
            run[q] = {}
            continue
        scores = np.array([np.max(np.asarray(doc_vecs[d]) @ q_vecs[i]) for d in ids], dtype=np.float64)
        top = np.argsort(-scores, kind="stable")[:depth]
        run[q] = {ids[j]: float(scores[j]) for j in top}
    return run


def fold_scores(qrels, run: Run, folds: Sequence[Sequence[str]], metric: str) -> list[float]:
    """``metric`` of ``run`` on each fold's queries (a fold without judged queries: skipped)."""
    return fold_means(query_scores(qrels, run, folds, metric), folds)


def query_scores(qrels, run: Run, folds: Sequence[Sequence[str]], metric: str) -> dict[str, float]:
    """``metric`` of ``run`` on each judged query of the folds (out-of-fold: each from its own fold's run)."""
    judged = {q: qrels[q] for fold in folds for q in fold if q in qrels}
    return per_query(judged, {q: run.get(q, {}) for q in judged}, (metric,))[canonical(metric)]


def fold_means(scores: Mapping[str, float], folds: Sequence[Sequence[str]]) -> list[float]:
    """The mean of ``scores`` over each fold's queries, rounded (a fold without scored queries: skipped)."""
    return [round(float(np.mean([scores[q] for q in fold if q in scores])), 4)
            for fold in folds if any(q in scores for q in fold)]


def candidates(dense_runs: Mapping[str, Run], sparse: Run, qrels, folds, *, lambdas, n_best: int,
               metric: str) -> list[dict]:
    """Every (model, mode, λ, normalisation) with its score on each fold, their mean and spread (sample standard
    deviation over folds), the same grid as the single split's (``select.choose_retriever``), and BM25 alone (under
    the first model: the zero-shot one), which is what fit does without labels for a language its encoder does not
    know."""
    from twotower.retrieval.hybrid import NORMS

    def row(name: str, order: int, mode: str, lam: float | None, norm: str | None, run: Run) -> dict:
        by_query = query_scores(qrels, run, folds, metric)
        scores = fold_means(by_query, folds)
        return {"model": name, "mode": mode, "lambda": lam, "norm": norm, "folds": scores,
                "mean": round(statistics.fmean(scores), 4),
                "spread": round(statistics.stdev(scores), 4) if len(scores) > 1 else 0.0, "_order": order,
                "_queries": by_query}

    rows = []
    for order, (name, dense) in enumerate(dense_runs.items()):
        options = ([("dense", None, None)] + [("hybrid", float(x), n) for n in NORMS for x in lambdas]
                   + [("rrf", None, None)])
        rows += [row(name, order, mode, lam, norm, select.fused(mode, dense, sparse, lam, n_best, norm))
                 for mode, lam, norm in options]
    return rows + [row(next(iter(dense_runs)), 0, "bm25", None, None, sparse)]


def _key(row: dict):
    """Best first: the higher mean, then the simpler mode, min-max, λ nearest 0.5, the earlier model."""
    from twotower.retrieval.hybrid import NORMS

    lam_gap = abs(row["lambda"] - 0.5) if row["lambda"] is not None else 0.0
    norm_order = list(NORMS).index(row["norm"]) if row["norm"] else 0
    return (-row["mean"], select.MODE_ORDER[row["mode"]], norm_order, lam_gap, row["_order"])


# the least mean gain (NDCG@10 and the like) a departure from the base must show over the folds, besides beating
# their spread: one query in 50 moves NDCG@10 by 0.02, and the best of ~80 candidates on a few dozen queries beats
# the default by about that much from noise alone (XQuAD-R en, 60 queries: z-score λ 0.65 gained +0.0101 on every
# fold, spread 0.0072, and lost 0.0023 on the 1130 test queries)
MIN_GAIN = 0.02
# ... and its mean gain over the queries must exceed this many standard errors of that mean (per-query gains,
# out-of-fold): the spread of 3 fold means is an estimate with 2 degrees of freedom, and can be small by luck (SciFact,
# 100 training queries: z-score λ 0.15 gained +0.0287 over λ 0.5, fold spread 0.0072, but 2.0 standard errors over
# the 100 queries, and lost 0.0226 on the 300 test queries); 3, not 2, as the best of ~80 settings is compared
MIN_T = 3.0


def _beats(row: dict, base: dict) -> tuple[bool, list[float], float, float, float | None]:
    """(wins, gain by fold, mean gain, spread, t): ``row`` beats ``base`` when its mean gain over the folds is at
    least :data:`MIN_GAIN`, above the sample standard deviation of the per-fold gains and, where the rows carry
    their per-query scores, above :data:`MIN_T` standard errors of the mean per-query gain (t: gain / that error)."""
    gains = [round(a - b, 4) for a, b in zip(row["folds"], base["folds"])]
    gain = statistics.fmean(gains)
    spread = statistics.stdev(gains) if len(gains) > 1 else float("inf")
    mine, theirs = row.get("_queries"), base.get("_queries")
    t = query_t(mine, theirs) if mine is not None and theirs is not None else None
    wins = gain >= MIN_GAIN - 1e-9 and gain > spread and (t is None or t > MIN_T)
    return wins, gains, gain, spread, t


def query_t(mine: Mapping[str, float], theirs: Mapping[str, float]) -> float:
    """The mean per-query gain of ``mine`` over ``theirs`` (scores by query id, the queries both hold) in standard
    errors of that mean (inf for a gain without variance, 0 for none)."""
    by_query = [mine[q] - theirs[q] for q in mine if q in theirs]
    if not by_query:
        return 0.0
    mean = statistics.fmean(by_query)
    error = statistics.stdev(by_query) / len(by_query) ** 0.5 if len(by_query) > 1 else float("inf")
    return mean / error if error > 0 else (float("inf") if mean > 0 else 0.0)


def held_out_gain(qrels, run: Run, base: Run, metric: str) -> tuple[bool, str]:
    """(pays, why): whether ``run`` departs from ``base`` by enough on one held-out fold's judged queries (``qrels``)
    to be believed, with cross-validation's own bar: a mean gain of at least :data:`MIN_GAIN` and above :data:`MIN_T`
    standard errors of the mean per-query gain (there are no folds to take a spread over). The re-ranker's test
    under cross-validation: on XQuAD-R de with 60 training queries, a cross-encoder trained on 40 of them raised the
    20 held-out queries' NDCG@10 from 0.771 to 0.7828 at weight 0.2 (the best of 10 weights), a quarter of one
    query's worth, and was kept; on the 1,130 test queries it added 0.0012 for 781 ms of re-ranking per query."""
    mine, theirs = (query_scores(qrels, r, [list(qrels)], metric) for r in (run, base))
    gain = statistics.fmean(mine[q] - theirs[q] for q in mine) if mine else 0.0
    t = query_t(mine, theirs)
    pays = gain >= MIN_GAIN - 1e-9 and t > MIN_T
    return pays, (f"gains {gain:+.4f} on the {len(mine)} held-out queries{_t_text(t)}: "
                  + (f"at least {MIN_GAIN} and {MIN_T:g} standard errors" if pays else
                     f"not at least {MIN_GAIN} and {MIN_T:g} standard errors: left out"))


def _t_text(t: float | None) -> str:
    return "" if t is None else f", {t:.1f} standard errors over the queries (at least {MIN_T:g} needed)"


def default_row(rows: list[dict], zero_shot: str = "zeroshot", mode: str = "hybrid",
                lam: float | None = DEFAULT_LAMBDA) -> dict | None:
    """The row of the retrieval fit uses without labels (``label_free.label_free_retriever``: by default the
    zero-shot hybrid at ``lam``; BM25 alone for a language the encoder does not know; dense alone across
    languages), min-max where it fuses (None where the grid lacks it)."""
    return next((r for r in rows if r["model"] == zero_shot and r["mode"] == mode
                 and r["lambda"] == (lam if mode == "hybrid" else None) and r["norm"] in (None, "minmax")), None)


def _name(row: dict) -> str:
    return row["mode"] + (f" λ {row['lambda']}" if row["lambda"] is not None else "") + (
        f" {row['norm']}" if row["norm"] else "")


def decide(rows: list[dict], zero_shot: str = "zeroshot", default: tuple[str, float | None] = ("hybrid", DEFAULT_LAMBDA)
           ) -> tuple[dict, dict]:
    """(chosen row, why) from :func:`candidates`, each departure paying for itself: the best zero-shot setting
    replaces the default one (``default``: the (mode, λ) fit uses without labels, :func:`default_row`) only where it
    beats it by the bar of :func:`_beats`; then the best fitted row replaces that only where it beats it the same
    way."""
    zs = min((r for r in rows if r["model"] == zero_shot), key=_key)
    base = default_row(rows, zero_shot, *default)
    why: dict = {}
    if base is not None and base is not zs:
        wins, gains, gain, spread, t = _beats(zs, base)
        why["zero_shot_setting"] = (
            f"{_name(zs)} beats the default {_name(base)} by "
            f"{gain:.4f} over the folds, at least {MIN_GAIN} and more than their spread ({spread:.4f}){_t_text(t)}"
            if wins else
            f"the best zero-shot setting ({_name(zs)}) gains {gain:+.4f} over the "
            f"default {_name(base)} (folds' spread {spread:.4f}{_t_text(t)}): not at least {MIN_GAIN}, "
            f"above the spread and {MIN_T:g} standard errors: the default is kept")
        zs = zs if wins else base
    others = [r for r in rows if r["model"] != zero_shot]
    why["best_zero_shot"] = _public(zs)
    if not others:
        return zs, {**why, "rule": "no fitted model to compare: the best zero-shot setting"}
    fitted = min(others, key=_key)
    wins, gains, gain, spread, t = _beats(fitted, zs)
    why.update({"best_fitted": _public(fitted), "gain_by_fold": gains, "mean_gain": round(gain, 4),
                "gain_spread": round(spread, 4), "gain_t": round(t, 2) if t is not None else None, "rule": (
                    f"{fitted['model']} beats zero-shot by {gain:.4f} on average over {len(gains)} folds, at least "
                    f"{MIN_GAIN} and more than the folds' spread of that gain ({spread:.4f}){_t_text(t)}" if wins else
                    f"{fitted['model']}'s mean gain over zero-shot ({gain:+.4f}; folds' spread {spread:.4f}"
                    f"{_t_text(t)}) is not at least {MIN_GAIN}, above the spread and {MIN_T:g} standard errors: the "
                    "zero-shot setting is kept")})
    return (fitted if wins else zs), why


def _public(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def public_rows(rows: list[dict]) -> list[dict]:
    return [_public(r) for r in rows]


def cv_stage(fit) -> dict:
    """The cv stage of the running fit (``run._Fit``): one model fine-tuned per fold on the other folds' pairs, its
    out-of-fold run over each held-out query's pool (kept in ``stages/cv/fold<i>/dev_run.json``; the fold model
    itself is deleted once its run is saved), then every candidate scored by fold and :func:`decide`."""
    import json
    import shutil
    import time

    from twotower.data.pairs import load_pairs, save_pairs
    from twotower.io import atomic_write_json
    from twotower.retrieval.dense import to_run
    from twotower.training.fit.corpus import CorpusVectors
    from twotower.training.fit.label_free import label_free_choice

    r = fit.recipe
    folds = fit.split()["folds"]
    zero_shot, sparse = fit.dev_run("zeroshot"), fit.bm25_dev()
    pairs = load_pairs(fit.out / "stages" / "split" / "train_pairs.jsonl")
    out_of_fold: Run = {}
    fold_info = []
    for i, held in enumerate(folds):
        folder = fit.stages.dir(f"cv/fold{i}")
        run_path = folder / "dev_run.json"
        started = time.perf_counter()
        if not run_path.is_file():
            out = set(held)
            fold_pairs = [p for p in pairs if p.qid not in out]
            save_pairs(fold_pairs, folder / "pairs.jsonl")
            model = fit.load_model(fit.train(f"cv/fold{i}", r.model, folder / "pairs.jsonl", r.epochs, 0))
            pools = {q: candidate_pool([zero_shot, sparse], q, r.n_best) for q in held}
            docs = sorted(set().union(*pools.values()))
            q_vecs = model.encode_queries([fit.ds.queries[q] for q in held], fit.encode_opts())
            if len(docs) > len(fit.doc_ids) // 2:  # the pools cost about a corpus: rank the whole corpus, exactly
                docs = list(fit.doc_ids)
            vecs = CorpusVectors.encode(model, [fit.ds.corpus[d] for d in docs], docs, fit.encode_opts())
            if len(docs) == len(fit.doc_ids):
                scores, rows = vecs.search(q_vecs, r.n_best)
                run = to_run(held, docs, scores, rows)
            else:
                run = pooled_run(q_vecs, held, pools, {d: vecs.of(j) for j, d in enumerate(docs)}, r.n_best)
            atomic_write_json(run_path, run)
            atomic_write_json(folder / "fold.json", {"held_out": held, "train_pairs": len(fold_pairs),
                                                     "pool_documents": len(docs),
                                                     "wall_s": round(time.perf_counter() - started, 1)})
            shutil.rmtree(folder / "run" / "model", ignore_errors=True)  # its run is all cv needs
            shutil.rmtree(folder / "run" / "checkpoints", ignore_errors=True)
        out_of_fold.update(json.loads(run_path.read_text()))
        fold_info.append({"fold": i, **json.loads((folder / "fold.json").read_text())})
    rows = candidates({"zeroshot": zero_shot, "finetune": out_of_fold}, sparse, fit.dev_qrels(), folds,
                      lambdas=r.lambdas, n_best=r.n_best, metric=r.metric)
    mode, lam, default_why, _ = label_free_choice(fit.data, r.model, fit.bm25_language(), DEFAULT_LAMBDA)
    chosen, why = decide(rows, default=(mode, lam))
    return {"folds": fold_info, "metric": r.metric, "chosen": _public(chosen), "why": {"default": default_why, **why},
            "candidates": public_rows(rows)}
