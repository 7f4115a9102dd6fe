"""The default search breadth of an ANN index (HNSW's ``efSearch``, IVF's ``nprobe``), calibrated at build time.

FAISS' own defaults (``efSearch`` 16, ``nprobe`` 1) lose recall as an index grows: HNSW32 at ``efSearch`` 16 found
0.84 of the exact top 10 at 55k documents and 0.80 at 300k (``benchmarks/results/ann_tradeoff.md``, ``filters.md``).
So a first build measures the breadth the index needs:

1. the last :func:`held_out_count` vectors are held out; the others are added to the index;
2. they and pseudo-queries made from them (:func:`pseudo_queries`: the normalised midpoint of two held-out vectors)
   are searched at growing breadths (:data:`EF_STEPS` / :data:`NPROBE_STEPS`), their top :data:`K` compared with
   exact inner-product search over the added vectors;
3. the smallest breadth at which the held-out vectors reach recall@10 :data:`HELD_OUT_TARGET` and the midpoints
   :data:`TARGET` is kept (when a set reaches no target — product or scalar quantization caps recall — the smallest
   breadth within :data:`PLATEAU` of its best); the held-out vectors are then added too.

Why midpoints, and why 0.90: real queries are not documents. A held-out document searched as a query lands on the
documents' own neighbourhoods and is easy — on 300k vectors with near-duplicates (``benchmarks/ann_defaults.py``'s
synthetic set) held-out documents reached recall@10 0.976 at efSearch 24 where real queries had 0.687. A midpoint
of two documents is, like a query, near no document, its neighbours split between two regions: it is harder than
real queries on every set measured, and recall@10 0.90 on midpoints meant >= 0.95 on the real queries
(SciFact 5k: efSearch 16, real 0.954; SciFact + 50k generated: 64, 0.961; 300k synthetic: 512, 0.990;
``benchmarks/results/ann_defaults.md``). Neither set alone is enough everywhere (on clustered vectors midpoints
were easier than queries from the same clusters: ``tests/test_ann_breadth.py``), so the breadth is the larger of the
two sets' needs.

The breadth is set on the FAISS index itself (FAISS saves ``efSearch`` / ``nprobe`` with it, and a copied index
keeps them: ``index add`` / ``remove`` keep the build's breadth) and recorded in the manifest
(:func:`manifest_entry`). A search without ``ef_search`` / ``nprobe`` uses it, and a filtered search widens from it
(:mod:`.filtered`). Exact (flat) and binary indexes are not calibrated; fewer than :data:`MIN_HELD_OUT` held-out
vectors (an index under ~200 vectors) keep FAISS' defaults.

Example::

    import numpy as np
    from twotower.retrieval.index.breadth import add_calibrated
    from twotower.retrieval.index.kinds import IndexSpec, new_faiss_index

    vectors = np.random.default_rng(0).standard_normal((2000, 32)).astype("float32")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index, _ = new_faiss_index(IndexSpec(kind="hnsw", hnsw_m=8), vectors, show_progress=False)
    chosen = add_calibrated(index, vectors, show_progress=False)
    assert index.ntotal == 2000 and chosen["ef_search"] >= 16
"""

from __future__ import annotations

import logging
import time

import numpy as np

from twotower.retrieval.index import kinds

log = logging.getLogger(__name__)

TARGET = 0.90  # recall@10 of the midpoint pseudo-queries against exact search (real queries: >= 0.95 measured)
HELD_OUT_TARGET = 0.97  # ... and of the held-out vectors themselves
PLATEAU = 0.005  # when TARGET is out of reach: the smallest breadth within this of the best recall measured
K = 10
MAX_HELD_OUT = 500
MIN_HELD_OUT = 20
EF_STEPS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
NPROBE_STEPS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def held_out_count(n: int) -> int:
    """How many of ``n`` vectors calibrate the breadth: a tenth, at most :data:`MAX_HELD_OUT` (0 under
    :data:`MIN_HELD_OUT`: too few to measure recall)."""
    m = min(MAX_HELD_OUT, n // 10)
    return m if m >= MIN_HELD_OUT else 0


def pseudo_queries(held_out: np.ndarray, seed: int = 0) -> np.ndarray:
    """Calibration queries: each held-out vector's normalised midpoint with another one (a random pairing)."""
    order = np.random.default_rng(seed).permutation(len(held_out))
    mid = held_out[order] + held_out[np.roll(order, 1)]
    norms = np.linalg.norm(mid, axis=1, keepdims=True)
    return np.ascontiguousarray(mid / np.where(norms > 0, norms, 1.0), dtype=np.float32)


def _knob(index):
    """``("ef_search", hnsw)`` / ``("nprobe", ivf)`` for an ANN index, else ``(None, None)``."""
    import faiss

    hnsw = kinds.find(index, "IndexHNSW")
    if hnsw is not None:
        return "ef_search", hnsw
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", ivf
    return None, None


def _params(knob: str, value: int):
    import faiss

    return faiss.SearchParametersHNSW(efSearch=value) if knob == "ef_search" else faiss.SearchParametersIVF(nprobe=value)


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """The share of ``truth``'s rows (-1: none) that ``found`` holds, query by query."""
    hits = sum(len(set(f[f >= 0]) & set(t[t >= 0])) for f, t in zip(found, truth))
    return hits / max(1, int((truth >= 0).sum()))


def smallest(measured: list[tuple[int, float]], target: float) -> tuple[int, float]:
    """The first ``(breadth, recall)`` of ``measured`` reaching ``target``, or within :data:`PLATEAU` of the best."""
    best = max(r for _, r in measured)
    return next((v, r) for v, r in measured if r >= min(target, best - PLATEAU))


def calibrate(index, query_sets: list[tuple[np.ndarray, np.ndarray, float]]) -> tuple[str, int, list[float]] | None:
    """``(knob, value, recalls)``: the smallest breadth at which ``index`` finds, for every ``(queries, truth,
    target)`` of ``query_sets``, ``target`` of ``truth`` (the exact top :data:`K` rows of ``queries``) — or comes
    within :data:`PLATEAU` of the best it reaches —, set on ``index``; ``recalls``: each set's at that breadth.
    ``None`` for an index without a breadth."""
    import faiss

    knob, inner = _knob(index)
    if knob is None:
        return None
    steps = EF_STEPS if knob == "ef_search" else [v for v in NPROBE_STEPS if v < inner.nlist] + [inner.nlist]
    pre = isinstance(faiss.downcast_index(index), faiss.IndexPreTransform)
    measured: list[list[tuple[int, float]]] = [[] for _ in query_sets]
    for value in steps:
        params = _params(knob, value)
        if pre:
            params = faiss.SearchParametersPreTransform(index_params=params)
        for curve, (queries, truth, _) in zip(measured, query_sets):
            _, found = index.search(queries, truth.shape[1], params=params)
            curve.append((value, recall_at(found, truth)))
        if all(r >= target for (_, r), (_, _, target) in zip((c[-1] for c in measured), query_sets)):
            break
    value = max(smallest(curve, target)[0] for curve, (_, _, target) in zip(measured, query_sets))
    recalls = [dict(curve)[value] for curve in measured]
    if knob == "ef_search":
        inner.hnsw.efSearch = int(value)
    else:
        inner.nprobe = int(value)
    return knob, int(value), recalls


def add_calibrated(index, vectors: np.ndarray, *, show_progress: bool) -> dict:
    """Add ``vectors`` (float32, the index's dimension) to the empty, trained ``index``, calibrating its default
    breadth on the last :func:`held_out_count` of them on the way. Returns :func:`manifest_entry`'s dict
    (empty when nothing was calibrated)."""
    import faiss

    n = len(vectors)
    m = held_out_count(n) if _knob(index)[0] is not None else 0
    if not m:
        kinds.add_in_chunks(index, vectors, show_progress=show_progress)
        return {}
    kinds.add_in_chunks(index, vectors[: n - m], show_progress=show_progress)
    t0 = time.perf_counter()
    held = np.ascontiguousarray(vectors[n - m :], dtype=np.float32)
    base = np.ascontiguousarray(vectors[: n - m], dtype=np.float32)
    query_sets = []
    for queries, target in ((held, HELD_OUT_TARGET), (pseudo_queries(held), TARGET)):
        _, truth = faiss.knn(queries, base, min(K, n - m), metric=faiss.METRIC_INNER_PRODUCT)
        query_sets.append((queries, truth, target))
    knob, value, recalls = calibrate(index, query_sets)
    log.info("default %s %d: recall@%d %.3f on %d held-out vectors, %.3f on their midpoints (%.1fs)", knob, value, K,
             recalls[0], m, recalls[1], time.perf_counter() - t0)
    kinds.add_in_chunks(index, vectors[n - m :], show_progress=False)
    return manifest_entry(knob, value, recalls, m, n - m)


def manifest_entry(knob: str, value: int, recalls: list[float], held_out: int, indexed: int) -> dict:
    """The manifest's ``search`` entry: the default breadth and how it was chosen."""
    return {knob: value, "calibration": {
        "held_out": held_out, "indexed": indexed, "k": K,
        "held_out_recall": round(recalls[0], 4), "held_out_target": HELD_OUT_TARGET,
        "midpoint_recall": round(recalls[1], 4), "midpoint_target": TARGET}}
