"""Sparse–dense hybrids on SciFact test: BM25 (uni / uni+bi-gram), dense (all-MiniLM-L6-v2), linear
interpolation with λ tuned on a held-out half of the *train* queries (never test), RRF, and
optionally a cross-encoder re-ranking the hybrid's top N.

    python benchmarks/hybrid_scifact.py [--rerank DIR] [--rerank-depth 100]

Dense vectors come from the cache of benchmarks/_vectors.py (.cache/vectors/).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rerank", type=Path, default=None, help="cross-encoder directory")
    parser.add_argument("--rerank-depth", type=int, default=100)
    parser.add_argument("--dev-fraction", type=float, default=0.5)
    args = parser.parse_args()

    from twotower.data.beir import load_corpus, load_qrels, load_queries
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.bm25 import BM25, BM25Params
    from twotower.retrieval.dense import exact_search, to_run
    from twotower.evaluation.tuning import tune_lambda
    from twotower.retrieval.hybrid import dev_split, interpolate, rrf
    from twotower.retrieval.searcher import HYBRID_N_BEST

    root = DATA / "scifact"
    corpus = load_corpus(root / "corpus.jsonl")
    queries = load_queries(root / "queries.jsonl")
    test_qrels, train_qrels = load_qrels(root / "qrels" / "test.tsv"), load_qrels(root / "qrels" / "train.tsv")
    dev_ids, _ = dev_split(train_qrels, args.dev_fraction, seed=0)
    dev_qrels = {q: train_qrels[q] for q in dev_ids}
    doc_ids, doc_vecs, qids, q_vecs = scifact_vectors()
    assert doc_ids == list(corpus), "cached vectors do not match the corpus: delete .cache/vectors"
    want = [q for q in qids if q in test_qrels or q in dev_qrels]
    q_index = {q: i for i, q in enumerate(qids)}
    texts = [corpus[d].full_text for d in doc_ids]

    t0 = time.perf_counter()
    scores, idx = exact_search(q_vecs[[q_index[q] for q in want]], doc_vecs, 1000)
    dense = to_run(want, doc_ids, scores, idx)
    dense_s = time.perf_counter() - t0
    sparse, sparse_s = {}, {}
    for name, ngram in (("bm25", 1), ("bm25-bigram", 2)):
        t0 = time.perf_counter()
        bm = BM25(BM25Params(ngram=ngram)).index(doc_ids, texts, show_progress=False)
        s, i = bm.search([queries[q] for q in want], 1000, show_progress=False)
        sparse[name] = to_run(want, doc_ids, s, i)
        sparse_s[name] = time.perf_counter() - t0

    def on(qrels, run):
        return {q: run[q] for q in qrels if q in run}

    def row(system, run, **extra):
        m = evaluate(test_qrels, on(test_qrels, run), ("ndcg@10", "recall@100", "mrr@10"))
        return {"system": system, **{k: round(v, 4) for k, v in m.items()}, **extra}

    rows = [row("bm25", sparse["bm25"], wall_s=round(sparse_s["bm25"], 2)),
            row("bm25-bigram", sparse["bm25-bigram"], wall_s=round(sparse_s["bm25-bigram"], 2)),
            row("dense", dense, wall_s=round(dense_s, 2))]
    tuned = {}
    for suffix, sp in (("", "bm25"), ("-bigram", "bm25-bigram")):
        lam, table = tune_lambda(on(dev_qrels, dense), on(dev_qrels, sparse[sp]), dev_qrels, n_best=HYBRID_N_BEST)
        tuned[sp] = (lam, table)
        fused = interpolate(on(test_qrels, dense), on(test_qrels, sparse[sp]), lam, n_best=HYBRID_N_BEST)
        rows.append(row(f"hybrid-linear{suffix}", fused, **{"lambda": lam, "dev_ndcg@10": round(table[lam], 4)}))
        rows.append(row(f"hybrid-rrf{suffix}", rrf([on(test_qrels, dense), on(test_qrels, sparse[sp])],
                                                   n_best=HYBRID_N_BEST)))
    if args.rerank:
        from twotower.retrieval.rerank import Reranker

        lam = tuned["bm25"][0]
        base = interpolate(on(test_qrels, dense), on(test_qrels, sparse["bm25"]), lam, n_best=HYBRID_N_BEST)
        t0 = time.perf_counter()
        rr = Reranker(args.rerank)
        reranked = rr.rerank(base, queries, lambda d: corpus[d].full_text, top_n=args.rerank_depth)
        rows.append(row(f"hybrid-linear+rerank@{args.rerank_depth}", reranked,
                        wall_s=round(time.perf_counter() - t0, 1)))
        reranked_d = rr.rerank(on(test_qrels, dense), queries, lambda d: corpus[d].full_text, top_n=args.rerank_depth)
        rows.append(row(f"dense+rerank@{args.rerank_depth}", reranked_d))

    notes = (
        f"SciFact test ({len(test_qrels)} queries). Dense: all-MiniLM-L6-v2 (cached vectors, max length 256, "
        f"exact inner product). BM25: bm25s k1 1.5 b 0.75, Snowball, English stopwords; bigram = unigrams + "
        f"adjacent-term bigrams. Hybrid: per-query min-max normalised scores over the union of each system's "
        f"{HYBRID_N_BEST}-best, λ·dense + (1−λ)·BM25, λ ∈ {{0, 0.05, …, 1}} tuned for NDCG@10 on {len(dev_qrels)} "
        f"held-out *train* queries (dev_split seed 0, fraction {args.dev_fraction}); test never used for tuning. "
        f"RRF k=60 over the same {HYBRID_N_BEST}-bests. Dev NDCG@10 by λ (unigram): "
        + ", ".join(f"{k:.2f}: {v:.4f}" for k, v in tuned["bm25"][1].items())
    )
    if args.rerank:
        notes += f"\n\nRe-ranker: {args.rerank} (twotower train-reranker), top {args.rerank_depth} re-scored."
    write_results("hybrid_scifact", rows, notes=notes)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
