"""Recall@10 and latency of ANN indexes searched with their default breadth, which a build now calibrates
(``twotower.retrieval.index.breadth``), against FAISS' own defaults (efSearch 16, nprobe 1) and exact search.

Data sets (384-d all-MiniLM-L6-v2 vectors, inner product on unit vectors, cached by ``_vectors.py``):

- ``scifact`` (5,183 documents): SciFact's document vectors; queries: its 300 test queries.
- ``scifact+50k`` (55,183 documents): SciFact's 5,183 document vectors, then 50,000 generated ones
  (``milvus_scifact.distractors``: a Gaussian with their mean and covariance, seed 0) — the HNSW set of
  ``filters.md``; queries: SciFact's 300 test queries.
- ``synth-300k`` (300,000 documents): SciFact document vectors cycled to 300,000 plus N(0, 0.03²) per dimension,
  re-normalised, shuffled (seed 0) — ``ann_tradeoff.py``'s synthetic set; queries: 300 real SciFact queries plus
  the same noise.

Each index is built as ``IndexStore.build`` builds it (``kinds.new_faiss_index``, then ``breadth.add_calibrated``'s
steps: the last 500 vectors held out, the breadth chosen, then they are added). Rows: the default breadth (what a
search without ``ef_search`` / ``nprobe`` uses), FAISS' default, and a sweep up to twice the default.
``heldout_recall@10`` / ``midpoint_recall@10``: the calibration's own measures at that breadth (the held-out
document vectors, and the midpoints of pairs of them, against exact search over the other documents; targets
0.97 / 0.90); ``recall@10``: the real queries' against exact search over every document. ``p50_ms``: median
single-query search, one FAISS thread; ``build_s``: training + adding + calibrating (``calibrate_s``).

    python benchmarks/ann_defaults.py [--sizes 5k,55k,300k] [--ivf] [--build-threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import write_results  # noqa: E402


def normalize(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def datasets(sizes: list[str]):
    from _vectors import scifact_vectors
    from milvus_scifact import distractors
    from twotower.data.beir import load_qrels
    from _common import DATA

    _, doc_vecs, qids, q_vecs = scifact_vectors()
    doc_vecs = np.ascontiguousarray(doc_vecs, dtype=np.float32)
    test = set(load_qrels(DATA / "scifact" / "qrels" / "test.tsv"))
    test_q = np.ascontiguousarray(q_vecs[[i for i, q in enumerate(qids) if q in test]], dtype=np.float32)
    rng = np.random.default_rng(0)
    if "5k" in sizes:
        yield "scifact", doc_vecs, test_q
    if "55k" in sizes:
        yield "scifact+50k", np.concatenate([doc_vecs, *distractors(doc_vecs, 50_000)]), test_q
    if "300k" in sizes:
        n = 300_000
        base = doc_vecs[np.arange(n) % len(doc_vecs)]
        synth = normalize(base + rng.standard_normal(base.shape, dtype=np.float32) * 0.03)[rng.permutation(n)]
        qs = q_vecs[rng.choice(len(q_vecs), 300, replace=False)]
        yield "synth-300k", synth, normalize(qs + rng.standard_normal(qs.shape, dtype=np.float32) * 0.03)


def latency_ms(index, queries: np.ndarray, params) -> float:
    times = []
    for i in range(len(queries)):
        t0 = time.perf_counter()
        index.search(queries[i : i + 1], 10, params=params)
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)]))


def run(name: str, vecs: np.ndarray, queries: np.ndarray, spec, build_threads: int) -> list[dict]:
    """Build ``spec`` over ``vecs`` as ``breadth.add_calibrated`` does (its steps spelled out, to keep the
    calibration sets' recall at every breadth of the sweep), then search ``queries`` at the default and the sweep."""
    import faiss

    from twotower.retrieval.index import breadth
    from twotower.retrieval.index.kinds import add_in_chunks, new_faiss_index

    n = len(vecs)
    _, truth = faiss.knn(queries, vecs, 10, metric=faiss.METRIC_INNER_PRODUCT)
    m = breadth.held_out_count(n)
    held, base = vecs[n - m :], vecs[: n - m]
    sets = []
    for q, target in ((held, breadth.HELD_OUT_TARGET), (breadth.pseudo_queries(held), breadth.TARGET)):
        sets.append((q, faiss.knn(q, base, 10, metric=faiss.METRIC_INNER_PRODUCT)[1], target))
    faiss.omp_set_num_threads(build_threads)
    t0 = time.perf_counter()
    index, factory = new_faiss_index(spec, vecs, show_progress=False)
    add_in_chunks(index, base, show_progress=False)
    t1 = time.perf_counter()
    knob, chosen, _ = breadth.calibrate(index, sets)
    calibrate_s = time.perf_counter() - t1
    inner = breadth._knob(index)[1]
    steps = breadth.EF_STEPS if knob == "ef_search" else [v for v in breadth.NPROBE_STEPS if v <= inner.nlist]
    faiss_default = 16 if knob == "ef_search" else 1
    sweep = sorted({s for s in steps if s <= 2 * chosen} | {faiss_default, chosen})
    curves = {}  # the calibration sets' recall@10 at each breadth of the sweep (before the held-out are added)
    for v in sweep:
        curves[v] = [recall(index.search(q, 10, params=breadth._params(knob, v))[1], t) for q, t, _ in sets]
    t2 = time.perf_counter()
    add_in_chunks(index, held, show_progress=False)
    build_s = time.perf_counter() - t0 - (t2 - t1) + calibrate_s  # without the sweep above
    faiss.omp_set_num_threads(1)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    exact_ms = latency_ms(flat, queries, None)
    del flat
    rows = [{"data": name, "n": n, "system": "flat (exact)", "recall@10": 1.0, "p50_ms": round(exact_ms, 3)}]
    faiss.omp_set_num_threads(build_threads)
    for v in sweep:
        params = None if v == chosen else breadth._params(knob, v)
        _, found = index.search(queries, 10, params=params)
        label = " (default, calibrated)" if v == chosen else " (FAISS default)" if v == faiss_default else ""
        row = {"data": name, "n": n, "system": f"{factory} {knob}={v}{label}",
               "recall@10": round(recall(found, truth), 4), "heldout_recall@10": round(curves[v][0], 4),
               "midpoint_recall@10": round(curves[v][1], 4)}
        faiss.omp_set_num_threads(1)
        row["p50_ms"] = round(latency_ms(index, queries, params), 3)
        faiss.omp_set_num_threads(build_threads)
        row.update({"build_s": round(build_s, 1), "calibrate_s": round(calibrate_s, 2)})
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5k,55k,300k")
    ap.add_argument("--build-threads", type=int, default=2)
    ap.add_argument("--ivf", action="store_true", help="also an IVF index (nlist ≈ 4·√n) on the 55k set")
    ap.add_argument("--name", default="ann_defaults")
    args = ap.parse_args()
    from twotower.retrieval.index.breadth import TARGET
    from twotower.retrieval.store import IndexSpec

    rows = []
    for name, vecs, queries in datasets(args.sizes.split(",")):
        # the defaults (M 32, efConstruction 200) at 55k; ann_tradeoff's M 16, efConstruction 100 at 300k (affordable
        # on 2 shared cores, and a harder graph: lower recall at a given efSearch)
        spec = IndexSpec(kind="hnsw") if len(vecs) < 100_000 else IndexSpec(kind="hnsw", hnsw_m=16, ef_construction=100)
        rows += run(name, vecs, queries, spec, args.build_threads)
        if args.ivf and len(vecs) < 100_000:  # IVF's k-means at 300k: minutes more on the shared cores
            rows += run(name, vecs, queries, IndexSpec(kind="ivf"), args.build_threads)
        write_results(args.name, rows, notes=NOTES.format(target=TARGET), extra={"load_average": os.getloadavg()})


NOTES = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0] + """

The real queries' recall at the default breadth is the number that matters (target >= 0.95); the midpoint target
is {target}."""


if __name__ == "__main__":
    main()
