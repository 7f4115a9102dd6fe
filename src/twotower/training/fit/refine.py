"""``twotower fit``'s third training round (*refine*): the retriever the select stage chose is trained once more on
lists of its own top-ranked documents. For each training example (query, judged positive) the chosen encoder's
top ``recipe.refine_candidates`` unjudged documents for the query are its hard negatives, all of them in one
in-batch softmax (ANCE / RocketQA's lesson: the negatives a dense retriever needs are the ones it ranks highest
now). The mining stage before it drew one negative from ranks 3–50 past a false-negative margin; this round takes
the very top, which on SciFact is where the remaining errors are (docs/guides/fit.md, "the third round").

The refined encoder is scored on dev like every other candidate (its dense run, every fusion with BM25) and
replaces the chosen retriever only where it raises the dev score; otherwise fit.json says why it was left out.
The same lists, scored by a cross-encoder, are what ``--reranker``'s distillation trains on (distill.py).
"""

from __future__ import annotations

from twotower.data.pairs import TrainExample, load_pairs, save_pairs
from twotower.training.fit import select
from twotower.training.fit.corpus import CorpusVectors


def candidate_lists(fit, model, docs: CorpusVectors, query_ids: list[str], k: int) -> list[TrainExample]:
    """The training examples of ``query_ids``, each with its query's top ``k`` unjudged documents (by ``model``) as
    negatives, topped up in rank order below the top k where judged documents took places; all lists as long as the
    shortest (a corpus with fewer than ``k`` unjudged documents for some query: that many)."""
    queries = sorted(q for q in query_ids if q in fit.ds.qrels)
    q_vecs = model.encode_queries([fit.ds.queries[q] for q in queries], fit.encode_opts())
    _, idx = docs.search(q_vecs, min(len(fit.doc_ids), k + 32))
    ranked = {q: [fit.doc_ids[j] for j in row] for q, row in zip(queries, idx)}
    keep = set(queries)
    chosen = []
    for ex in load_pairs(fit.out / "stages" / "split" / "train_pairs.jsonl"):
        if ex.qid in keep:
            judged = fit.ds.qrels[ex.qid]
            chosen.append((ex, [d for d in ranked[ex.qid] if d not in judged][:k]))
    size = min((len(negs) for _, negs in chosen), default=0)
    if size < 1:
        return []
    return [TrainExample(query=ex.query, positive=ex.positive, qid=ex.qid, pid=ex.pid,
                         negatives=[fit.doc_text(d) for d in negs[:size]], negative_ids=negs[:size])
            for ex, negs in chosen]


def keep_if_better(fit, stage: str, before: dict, dense: dict, path) -> tuple[dict, bool]:
    """The best retrieval of ``stage``'s encoder (its dev run ``dense``, every fusion with BM25) against ``before``
    (the retrieval chosen so far): ``(best, kept)``, kept only where it raises the dev score; then the encoder at
    ``path`` with that retrieval is the fitted model."""
    r = fit.recipe
    runs = {before["model"]: fit.dev_run(before["model"]), stage: dense}
    best, _ = select.choose_retriever(runs, fit.bm25_dev(), fit.dev_qrels(), lambdas=r.lambdas, n_best=r.n_best,
                                      metric=r.metric)
    kept = best["model"] == stage and best["dev"][r.metric] > before["dev"][r.metric]
    if kept:
        fit.write_choice(best, path=path)
    return best, kept


def refine_stage(fit) -> dict:
    """The refine stage of the running fit (``run._Fit``, single dev split): the lists, the training, the refined
    encoder's dev candidates and whether it replaced the chosen retriever."""
    r = fit.recipe
    before = fit.stages.done("select")["chosen"]
    start = fit.model_path(before["model"])
    folder = fit.stages.dir("refine")
    lists = folder / "lists.jsonl"
    if not lists.is_file():
        model = fit.load_model(start)
        save_pairs(candidate_lists(fit, model, fit.doc_vectors(before["model"], model), fit.split()["train"],
                                   r.refine_candidates), lists)
    examples = load_pairs(lists)
    if not examples:
        return {"settings": r.refine_settings(), "kept": False, "chosen": before, "lists": 0,
                "why": f"no training query has {r.refine_candidates} unjudged documents to rank: nothing to refine on"}
    size = len(examples[0].negatives)
    # a quarter of the batch: each example brings its whole list (1 + size texts), so the step holds about as many
    # texts as the fine-tune's; each list's first window (the lists rank whole documents)
    path = fit.train("refine", None if start is None else str(start), lists, r.refine_epochs, size,
                     batch_size=max(2, r.batch_size // 4), train_passage="first")
    dense = fit.dense_dev("refine", fit.load_model(path))
    best, kept = keep_if_better(fit, "refine", before, dense, path)
    return {"settings": r.refine_settings(), "model": str(path.relative_to(fit.out)), "kept": kept,
            "chosen": best if kept else before, "started_from": before["model"], "dev_before": before["dev"],
            "dev_best_refined": best["dev"], "dev_dense": select.score(fit.dev_qrels(), dense),
            "lists": len(examples), "list_size": size, "examples_per_s": fit.last_rate,
            "why": ("the refined encoder's best retrieval beats the chosen one on dev" if kept else
                    "the refined encoder does not beat the chosen retrieval on dev: left out")}
