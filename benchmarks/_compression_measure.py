"""How compression_scifact measures a row (NDCG@10 / R@100 of a run, batch-1 p50, top-10 overlap with exact fp32)
and the peer: sentence-transformers' quantisation on the same vectors, and ours against its recipe query by query."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

K = 100  # every run keeps the top 100 (R@100); NDCG@10 reads its first 10


def metrics_of(qrels, qids, doc_ids, scores, rows) -> dict:
    from twotower.evaluation.metrics import evaluate

    run = {q: {doc_ids[r]: float(s) for s, r in zip(ss, rr) if r >= 0} for q, ss, rr in zip(qids, scores, rows)}
    return evaluate(qrels, run, ("ndcg@10", "recall@100"))


def p50(fn, queries: np.ndarray) -> float:
    for i in range(5):
        fn(queries[i : i + 1])
    times = []
    for i in range(len(queries)):
        t0 = time.perf_counter()
        fn(queries[i : i + 1])
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def overlap10(rows: np.ndarray, ref: np.ndarray | None) -> dict:
    """``fp32_top10_overlap``: the mean share of the exact fp32 top 10 that ``rows``' top 10 keeps."""
    if ref is None:
        return {}
    return {"fp32_top10_overlap": float(np.mean([len(set(a[:10]) & set(b)) / 10 for a, b in zip(rows, ref)]))}


def st_recipe(docs: np.ndarray, factor: int):
    """sentence-transformers' retrieve-and-rescore recipe on ``docs``: ``(search(q, k), binary index, bits, int8)``."""
    import faiss
    from sentence_transformers.util.quantization import quantize_embeddings

    ub = quantize_embeddings(docs, precision="ubinary")
    index = faiss.IndexBinaryFlat(docs.shape[1])
    index.add(ub)
    int8 = quantize_embeddings(docs, precision="int8", calibration_embeddings=docs)

    def recipe(q, k):  # binary search, rescore the top k × factor with the float query against int8
        _, cand = index.search(quantize_embeddings(q, precision="ubinary"), k * factor)
        scores = np.einsum("ij,ikj->ik", q, int8[cand].astype(np.float32))
        order = np.argsort(-scores, axis=1)[:, :k]
        return np.take_along_axis(scores, order, 1), np.take_along_axis(cand, order, 1)

    return recipe, index, ub, int8


def peer_gap(work: Path, docs, doc_ids, titles, texts, query_sets: dict, factor: int) -> dict:
    """Ours (binary + int8 rescoring × factor) against sentence-transformers' recipe, query by query: for each
    query set, both means, the mean per-query difference (ours − peer) with a paired bootstrap 95% interval
    (10,000 resamples of the queries, seed 0) and how many queries each side wins."""
    from twotower.evaluation.metrics import per_query
    from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

    out = work / "indexes" / "peer_gap"
    shutil.rmtree(out, ignore_errors=True)
    store = IndexStore.build(out, NewDocs(doc_ids, titles, texts, docs), model={"name": "cached vectors"},
                             spec=IndexSpec(vectors="binary", rescore_factor=factor), show_progress=False)
    recipe = st_recipe(docs, factor)[0]
    result = {}
    for name, (qrels, qids, qv) in query_sets.items():
        per = []
        for search in (lambda q: store.search(q, K), lambda q: recipe(q, K)):
            scores, rows = search(qv)
            run = {q: {doc_ids[r]: float(x) for x, r in zip(ss, rr) if r >= 0} for q, ss, rr in zip(qids, scores, rows)}
            per.append(per_query(qrels, run, ("ndcg@10",))["ndcg@10"])
        diff = np.array([per[0][q] - per[1][q] for q in per[0]])
        rng = np.random.default_rng(0)
        boot = diff[rng.integers(0, len(diff), (10_000, len(diff)))].mean(axis=1)
        result[name] = {"queries": len(diff), "ours": float(np.mean(list(per[0].values()))),
                        "peer": float(np.mean(list(per[1].values()))), "ours_minus_peer": float(diff.mean()),
                        "ci95": [float(x) for x in np.percentile(boot, [2.5, 97.5])],
                        "ours_better": int((diff > 1e-9).sum()), "peer_better": int((diff < -1e-9).sum())}
    store.close()
    shutil.rmtree(out, ignore_errors=True)
    return result


def gap_note(gaps: dict, factor: int) -> str:
    """The query-by-query comparison of every vector set (``{vectors: peer_gap(...)}``) as one sentence."""
    parts = [f"{vectors}, {k} queries ({g['queries']}): {g['ours']:.4f} vs {g['peer']:.4f}, difference "
             f"{g['ours_minus_peer']:+.4f} [{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}], ours better on "
             f"{g['ours_better']}, the peer on {g['peer_better']}"
             for vectors, sets in gaps.items() for k, g in sets.items()]
    return (f"Query by query, on each set of vectors (ours binary + int8 rescoring x{factor} minus the peer's "
            f"recipe x{factor}, paired bootstrap 95% interval): " + "; ".join(parts) + ". ")


def st_rows(docs, doc_ids, qrels, qids, qv, factor: int, ref: np.ndarray, other) -> dict[str, dict]:
    """sentence-transformers' quantisation on the same vectors."""
    from sentence_transformers.util.quantization import semantic_search_faiss

    n = len(doc_ids)
    rows = {}
    t0 = time.perf_counter()
    recipe, index, ub, int8 = st_recipe(docs, factor)
    build_s = time.perf_counter() - t0

    def on_train_queries(search) -> dict:
        o_qrels, o_qids, o_qv = other
        return {"train_q_ndcg@10": metrics_of(o_qrels, o_qids, doc_ids, *search(o_qv, K))["ndcg@10"]}

    s, r = recipe(qv, K)
    rows[f"sentence-transformers binary + int8 rescoring x{factor}"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), **on_train_queries(recipe), **overlap10(r, ref), "ram_bytes_per_doc": ub.nbytes / n,
        "disk_bytes_per_doc": (ub.nbytes + int8.nbytes) / n, "p50_ms": p50(lambda q: recipe(q, 10), qv),
        "build_s": build_s, "factory": "IndexBinaryFlat + quantize_embeddings", "dim": docs.shape[1]}

    def library(q, k):
        results, _ = semantic_search_faiss(q, corpus_index=index, corpus_precision="ubinary", top_k=k,
                                              rescore=True, rescore_multiplier=factor)
        return (np.array([[h["score"] for h in res] for res in results]),
                np.array([[h["corpus_id"] for h in res] for res in results]))

    s, r = library(qv, K)
    rows[f"sentence-transformers semantic_search_faiss ubinary rescore x{factor}"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), **on_train_queries(library), **overlap10(r, ref), "ram_bytes_per_doc": ub.nbytes / n,
        "disk_bytes_per_doc": ub.nbytes / n, "p50_ms": p50(lambda q: library(q, 10), qv), "build_s": build_s,
        "factory": "semantic_search_faiss", "dim": docs.shape[1]}

    i8 = int8.astype(np.float32)

    def int8_exact(q, k):
        scores = q @ i8.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1), 1)
        return np.take_along_axis(scores, order, 1), order

    s, r = int8_exact(qv, K)
    rows["sentence-transformers int8 (float query x int8 codes)"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), **on_train_queries(int8_exact), **overlap10(r, ref), "ram_bytes_per_doc": int8.nbytes / n,
        "disk_bytes_per_doc": int8.nbytes / n, "p50_ms": p50(lambda q: int8_exact(q, 10), qv), "build_s": build_s,
        "factory": "quantize_embeddings int8", "dim": docs.shape[1]}
    return rows
