"""ANN recall@10 (against exact search) vs batch-1 query latency, build time and index size.

Data sets (384-d, inner product on unit vectors):
- ``scifact``: the 5,183 SciFact document vectors of all-MiniLM-L6-v2, the 1,109 real queries.
- ``synth-1M``: 1M structured vectors: SciFact document vectors (cycled) plus Gaussian noise
  (σ per dim, default 0.03), re-normalised; queries are real query vectors plus the same noise.
- ``uniform-100k``: uniform random directions, the worst case (no neighbourhood structure).

    python benchmarks/ann_tradeoff.py [--n 1000000] [--hnsw-n 300000] [--queries 300]

Each setting goes through ``twotower.retrieval.store`` (IndexSpec → FAISS factory; efSearch /
nprobe as per-call search parameters). Latency: median over single-query searches, 1 FAISS thread
per query as a serving process would do between requests (set by FAISS's OpenMP default).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import RESULTS, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402


def normalize(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def latency_ms(index, queries: np.ndarray, params, reps: int) -> float:
    times = []
    for i in range(min(reps, len(queries))):
        q = queries[i : i + 1]
        t0 = time.perf_counter()
        index.search(q, 10, params=params)
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)]))


def bench(name: str, docs: np.ndarray, queries: np.ndarray, settings: list, reps: int) -> list[dict]:
    import faiss

    from twotower.retrieval.index.kinds import add_in_chunks as _add_in_chunks, new_faiss_index as _new_faiss_index
    from twotower.retrieval.store import search_params, tune_faiss

    tune_faiss()
    rows = []
    flat = faiss.IndexFlatIP(docs.shape[1])
    flat.add(docs)
    t0 = time.perf_counter()
    _, truth = flat.search(queries, 10)
    print(f"[{name}] exact ground truth for {len(queries)} queries in {time.perf_counter() - t0:.1f}s", flush=True)
    base_ms = latency_ms(flat, queries, None, reps)
    rows.append({"data": name, "system": "flat (exact)", "recall@10": 1.0, "p50_ms": round(base_ms, 3),
                 "speedup": 1.0, "build_s": 0.0, "bytes": int(docs.nbytes), "n": len(docs)})
    del flat
    for spec, knob, values, subset in settings:
        d = docs if subset is None or subset >= len(docs) else docs[:subset]
        if d is not docs:  # a subset needs its own ground truth and exact baseline
            sub = faiss.IndexFlatIP(d.shape[1])
            sub.add(d)
            _, sub_truth = sub.search(queries, 10)
            sub_ms = latency_ms(sub, queries, None, reps)
            del sub
        else:
            sub_truth, sub_ms = truth, base_ms
        t0 = time.perf_counter()
        index, factory = _new_faiss_index(spec, d, show_progress=False)
        _add_in_chunks(index, d, show_progress=False)
        build_s = time.perf_counter() - t0
        size = len(faiss.serialize_index(index))
        for v in values:
            params = search_params(index, **{knob: v}) if knob else None
            _, found = index.search(queries, 10, params=params)
            ms = latency_ms(index, queries, params, reps)
            row = {"data": name, "system": f"{factory}" + (f" {knob}={v}" if knob else ""),
                   "recall@10": round(recall_at_10(found, sub_truth), 4), "p50_ms": round(ms, 3),
                   "speedup": round(sub_ms / ms, 1), "build_s": round(build_s, 1), "bytes": size, "n": len(d)}
            if d is not docs:
                row["exact_p50_ms_on_n"] = round(sub_ms, 3)
            print(row, flush=True)
            rows.append(row)
        del index
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    datasets = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.5), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        sub = [r for r in rows if r["data"] == name]
        families = {}
        for r in sub:
            fam = r["system"].split(" ")[0] + (f" (n={r['n']:,})" if "exact_p50_ms_on_n" in r else "")
            families.setdefault(fam, []).append(r)
        for fam, rs in families.items():
            ax.plot([r["p50_ms"] for r in rs], [r["recall@10"] for r in rs], marker="o", label=fam)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 0.02, 0.05, 0.1, ...: readable on narrow ranges
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("median latency per query (ms, log)")
        ax.set_ylabel("recall@10 vs exact")
        ax.set_title(name)
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--hnsw-n", type=int, default=300_000, help="HNSW on the first N synthetic vectors")
    parser.add_argument("--sigma", type=float, default=0.03)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--skip-synth", action="store_true")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from results/ann_tradeoff.json")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((RESULTS / "ann_tradeoff.json").read_text())["rows"], RESULTS / "ann_tradeoff.png")
        return

    from twotower.retrieval.store import IndexSpec

    _, doc_vecs, _, q_vecs = scifact_vectors()
    rng = np.random.default_rng(0)
    rows = bench("scifact", doc_vecs, q_vecs, [
        (IndexSpec(kind="hnsw", hnsw_m=32), "ef_search", [16, 32, 64, 128], None),
        (IndexSpec(kind="ivf"), "nprobe", [1, 4, 16, 64], None),
        (IndexSpec(kind="ivfpq", pq_m=48), "nprobe", [4, 16, 64], None),
    ], args.reps)

    if not args.skip_synth:
        n = args.n
        base = doc_vecs[np.arange(n) % len(doc_vecs)]
        synth = np.empty_like(base)
        for s in range(0, n, 100_000):  # noise in chunks to bound memory
            block = base[s : s + 100_000] + rng.standard_normal(base[s : s + 100_000].shape, dtype=np.float32) * args.sigma
            synth[s : s + 100_000] = normalize(block)
        del base
        perm = rng.permutation(n)
        synth = synth[perm]
        qs = q_vecs[rng.choice(len(q_vecs), args.queries, replace=False)]
        qs = normalize(qs + rng.standard_normal(qs.shape, dtype=np.float32) * args.sigma)
        rows += bench(f"synth-{n // 1000}k", synth, qs, [
            (IndexSpec(kind="ivf", nlist=4096), "nprobe", [4, 16, 32, 64, 128], None),
            (IndexSpec(kind="ivfpq", nlist=4096, pq_m=48), "nprobe", [16, 64], None),
            (IndexSpec(kind="hnsw", hnsw_m=16, ef_construction=100), "ef_search", [32, 64, 128, 256], args.hnsw_n),
        ], args.reps)
        del synth
        uni = normalize(rng.standard_normal((100_000, 384), dtype=np.float32))
        uq = normalize(rng.standard_normal((args.queries, 384), dtype=np.float32))
        rows += bench("uniform-100k", uni, uq, [
            (IndexSpec(kind="hnsw", hnsw_m=32, ef_construction=100), "ef_search", [64, 256], None),
            (IndexSpec(kind="ivf", nlist=256), "nprobe", [16, 64], None),
        ], args.reps)

    png = RESULTS / "ann_tradeoff.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(rows, png)
    notes = (
        f"recall@10 = overlap of the top 10 with exact inner-product search, averaged over the queries; p50_ms = "
        f"median single-query search time over {args.reps} queries; speedup = exact p50 / setting p50 on the same "
        f"vectors; bytes = serialized FAISS index. synth: SciFact doc vectors cycled to n, plus N(0, {args.sigma}²) "
        f"per dim, re-normalised; {args.queries} real SciFact queries plus the same noise. HNSW on the synthetic set "
        f"uses M=16, efConstruction=100 on the first {args.hnsw_n:,} vectors (its exact baseline is re-measured on "
        f"that subset: exact_p50_ms_on_n) to keep the build affordable on 2 cores. Plot: {png.name}."
    )
    write_results("ann_tradeoff", rows, notes=notes)


if __name__ == "__main__":
    main()
