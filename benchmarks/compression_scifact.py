"""Compressed vectors on SciFact (issue #33): quality against memory per document.

Every twotower row is a real index directory written by ``twotower.retrieval.store.IndexStore.build`` from
the same cached document vectors (``--vectors``, ``--dim``, ``--kind``; build_s = that write, without
encoding) and searched through ``IndexStore.search`` with the cached query vectors:

- fp32 / fp16 / int8 (FAISS SQfp16 / SQ8 with per-dimension ranges from the corpus), exact;
- binary: sign bits in a FAISS binary flat index, Hamming top k × 4 rescored with the float query against the
  int8 (or fp32) vectors memory-mapped from disk, and without rescoring;
- PQ: the existing ``ivfpq`` kind (48 and 96 sub-quantizers), every IVF list probed so that only PQ's
  approximation is measured;
- the peer, sentence-transformers on the same vectors: ``quantize_embeddings(…, "ubinary")`` in a FAISS binary
  index, Hamming top k × 4 rescored with the float query against ``quantize_embeddings(…, "int8")`` (its
  retrieve-and-rescore recipe), ``semantic_search_faiss(corpus_precision="ubinary", rescore_multiplier=4)``
  (which rescores against the unpacked bits), and the float query against its int8 codes;
- Matryoshka: all-MiniLM-L6-v2 fine-tuned on SciFact train twice with the same settings and seed, once
  plainly and once with ``matryoshka = [384, 192, 96, 48]``, each cut with ``--dim`` to 192 / 96 / 48.

Metrics: SciFact test NDCG@10 and R@100 (top-100 runs); ram_bytes_per_doc: the FAISS index file (what a
search process holds in memory) / documents; disk_bytes_per_doc: vectors.npy + faiss.index (+ calibration) /
documents (binary rows keep their rescoring vectors there, memory-mapped); p50_ms: batch-1 vector search
(top 10; query encoding excluded), median over the test queries. FAISS runs on one OpenMP thread throughout
(as a serving process between requests; on 2 shared cores, two spinning OpenMP threads made the same
batch-1 flat search vary from 0.3 to 280 ms).

    python benchmarks/compression_scifact.py [--work .cache/compression] [--epochs 1] [--lr 5e-5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import DATA, RESULTS, cached_row, load_average, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402

K = 100
MRL_DIMS = [384, 192, 96, 48]


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


def store_row(work: Path, name: str, docs, doc_ids, titles, texts, qrels, qids, qv, spec, **search) -> dict:
    from twotower.retrieval.store import IndexStore, NewDocs

    out = work / "indexes" / name.replace(" ", "_")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    store = IndexStore.build(out, NewDocs(doc_ids, titles, texts, docs), model={"name": "cached vectors"},
                             spec=spec, show_progress=False)
    build_s = time.perf_counter() - t0
    scores, rows = store.search(qv, K, **search)
    n = len(doc_ids)
    files = ["vectors.npy", "faiss.index", "calibration.npy"]
    disk = sum((store.dir / f).stat().st_size for f in files if (store.dir / f).is_file())
    row = {**metrics_of(qrels, qids, doc_ids, scores, rows),
           "ram_bytes_per_doc": (store.dir / "faiss.index").stat().st_size / n, "disk_bytes_per_doc": disk / n,
           "p50_ms": p50(lambda q: store.search(q, 10, **search), qv), "build_s": build_s,
           "factory": store.manifest["factory"], "dim": store.dim}
    store.close()
    shutil.rmtree(out, ignore_errors=True)
    return row


def st_rows(docs, doc_ids, qrels, qids, qv, factor: int) -> dict[str, dict]:
    """sentence-transformers' quantisation on the same vectors."""
    import faiss
    from sentence_transformers.util.quantization import quantize_embeddings, semantic_search_faiss

    n = len(doc_ids)
    rows = {}
    t0 = time.perf_counter()
    ub = quantize_embeddings(docs, precision="ubinary")
    index = faiss.IndexBinaryFlat(docs.shape[1])
    index.add(ub)
    int8 = quantize_embeddings(docs, precision="int8", calibration_embeddings=docs)
    build_s = time.perf_counter() - t0

    def recipe(q, k):  # binary search, rescore the top k × factor with the float query against int8
        _, cand = index.search(quantize_embeddings(q, precision="ubinary"), k * factor)
        scores = np.einsum("ij,ikj->ik", q, int8[cand].astype(np.float32))
        order = np.argsort(-scores, axis=1)[:, :k]
        return np.take_along_axis(scores, order, 1), np.take_along_axis(cand, order, 1)

    s, r = recipe(qv, K)
    rows[f"sentence-transformers binary + int8 rescoring x{factor}"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), "ram_bytes_per_doc": ub.nbytes / n,
        "disk_bytes_per_doc": (ub.nbytes + int8.nbytes) / n, "p50_ms": p50(lambda q: recipe(q, 10), qv),
        "build_s": build_s, "factory": "IndexBinaryFlat + quantize_embeddings", "dim": docs.shape[1]}

    def library(q, k):
        results, _, _ = semantic_search_faiss(q, corpus_index=index, corpus_precision="ubinary", top_k=k,
                                              rescore=True, rescore_multiplier=factor)
        return (np.array([[h["score"] for h in res] for res in results]),
                np.array([[h["corpus_id"] for h in res] for res in results]))

    s, r = library(qv, K)
    rows[f"sentence-transformers semantic_search_faiss ubinary rescore x{factor}"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), "ram_bytes_per_doc": ub.nbytes / n,
        "disk_bytes_per_doc": ub.nbytes / n, "p50_ms": p50(lambda q: library(q, 10), qv), "build_s": build_s,
        "factory": "semantic_search_faiss", "dim": docs.shape[1]}

    i8 = int8.astype(np.float32)

    def int8_exact(q, k):
        scores = q @ i8.T
        order = np.argsort(-scores, axis=1)[:, :k]
        return np.take_along_axis(scores, order, 1), order

    s, r = int8_exact(qv, K)
    rows["sentence-transformers int8 (float query x int8 codes)"] = {
        **metrics_of(qrels, qids, doc_ids, s, r), "ram_bytes_per_doc": int8.nbytes / n,
        "disk_bytes_per_doc": int8.nbytes / n, "p50_ms": p50(lambda q: int8_exact(q, 10), qv), "build_s": build_s,
        "factory": "quantize_embeddings int8", "dim": docs.shape[1]}
    return rows


def train(work: Path, name: str, args, matryoshka) -> tuple[Path, float]:
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    out = work / "train" / name
    model = out / "model"
    meta = out / "bench.json"
    settings = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "matryoshka": matryoshka}
    if model.is_dir() and meta.is_file() and json.loads(meta.read_text())["settings"] == settings:
        return model, json.loads(meta.read_text())["wall_s"]
    shutil.rmtree(out, ignore_errors=True)
    stage = StageConfig(data=str(DATA / "scifact"), epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                        warmup=0.1, temperature=0.05)
    cfg = TrainConfig(out=str(out), precision="auto", doc_max_length=256, query_max_length=256, seed=0,
                      checkpoint_every=10_000, attention_dropout=0.0, stages=[stage], matryoshka=matryoshka)
    t0 = time.perf_counter()
    Trainer(cfg).train()
    wall = time.perf_counter() - t0
    meta.write_text(json.dumps({"settings": settings, "wall_s": wall}))
    return model, wall


def encode(model: Path, corpus, doc_ids, queries, qids) -> tuple[np.ndarray, np.ndarray]:
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    cache = model.parent / "vectors.npz"
    if cache.is_file():
        z = np.load(cache)
        return z["docs"], z["queries"]
    enc = DualEncoder.load(str(model))
    docs = enc.encode_documents([corpus[d].full_text for d in doc_ids], EncodeOptions())
    qv = enc.encode_queries([queries[q] for q in qids], EncodeOptions(show_progress=False))
    np.savez(cache, docs=docs, queries=qv)
    return docs, qv


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for r in rows:
        group = r.get("group", "")
        marker = {"zero-shot": "o", "peer": "s", "plain fine-tuned": "v", "matryoshka fine-tuned": "^"}.get(group, "o")
        color = {"zero-shot": "tab:blue", "peer": "tab:red", "plain fine-tuned": "tab:gray",
                 "matryoshka fine-tuned": "tab:green"}.get(group, "tab:blue")
        ax.scatter(r["ram_bytes_per_doc"], r["ndcg@10"], marker=marker, color=color,
                   label=group if group not in ax.get_legend_handles_labels()[1] else None)
        ax.annotate(r["system"].replace("sentence-transformers", "ST"), (r["ram_bytes_per_doc"], r["ndcg@10"]),
                    fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per document held in RAM (FAISS index)")
    ax.set_ylabel("SciFact test NDCG@10")
    ax.set_title("Compressed vectors: quality vs memory (all-MiniLM-L6-v2, SciFact)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(Path(__file__).resolve().parents[1] / ".cache" / "compression"))
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--factor", type=int, default=4, help="Rescore factor of the binary rows.")
    ap.add_argument("--skip-training", action="store_true", help="Only the zero-shot rows.")
    args = ap.parse_args()

    from twotower.data.beir import BeirDataset, load_corpus
    from twotower.retrieval.store import IndexSpec

    import faiss

    faiss.omp_set_num_threads(1)
    work = Path(args.work)
    ds = BeirDataset.load(DATA / "scifact", "test")
    qrels = ds.qrels
    corpus = load_corpus(DATA / "scifact" / "corpus.jsonl")
    doc_ids, docs, all_qids, all_qv = scifact_vectors()
    pos = {q: i for i, q in enumerate(all_qids)}
    qids = [q for q in all_qids if q in qrels]
    qv = np.ascontiguousarray(all_qv[[pos[q] for q in qids]])
    titles, texts = [corpus[d].title for d in doc_ids], [corpus[d].text for d in doc_ids]
    f = args.factor
    rows: list[dict] = []

    def add(name: str, group: str, settings: dict, compute) -> dict:
        row = cached_row(work, name, {**settings, "group": group}, compute)
        row = {"system": name, "group": group, **{k: v for k, v in row.items() if k != "system"}}
        rows.append(row)
        return row

    def ours(name, group, vecs, queries, spec, settings, **search):
        return add(name, group, settings, lambda: store_row(work, name, vecs, doc_ids, titles, texts, qrels, qids,
                                                            queries, spec, **search))

    zs = {"model": "all-MiniLM-L6-v2", "faiss_threads": 1}
    ours("fp32", "zero-shot", docs, qv, IndexSpec(), zs)
    ours("fp16", "zero-shot", docs, qv, IndexSpec(vectors="fp16"), zs)
    ours("int8", "zero-shot", docs, qv, IndexSpec(vectors="int8"), zs)
    ours(f"binary + int8 rescoring x{f}", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore_factor=f), zs)
    ours(f"binary + fp32 rescoring x{f}", "zero-shot", docs, qv,
         IndexSpec(vectors="binary", rescore="fp32", rescore_factor=f), zs)
    ours("binary + int8 rescoring x10", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore_factor=10), zs)
    ours("binary, no rescoring", "zero-shot", docs, qv, IndexSpec(vectors="binary", rescore="none"), zs)
    nlist = int(IndexSpec(kind="ivfpq").factory(384, len(doc_ids)).split(",")[0][3:])
    for m in (48, 96):
        ours(f"ivfpq PQ{m} (all {nlist} lists probed)", "zero-shot", docs, qv, IndexSpec(kind="ivfpq", pq_m=m), zs,
             nprobe=nlist)
    for d in (192, 96, 48):
        ours(f"fp32 cut to {d}", "zero-shot", docs, qv, IndexSpec(dim=d), zs)
    peer = st_rows(docs, doc_ids, qrels, qids, qv, f)
    for name, row in peer.items():
        add(name, "peer", {**zs, "factor": f}, lambda row=row: row)

    train_walls = {}
    if not args.skip_training:
        all_queries = ds.queries
        for label, mrl in (("plain fine-tuned", None), ("matryoshka fine-tuned", MRL_DIMS)):
            model, wall = train(work, "mrl" if mrl else "plain", args, mrl)
            train_walls[label] = round(wall, 1)
            dv, tq = encode(model, corpus, doc_ids, all_queries, qids)
            settings = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "mrl": mrl,
                        "faiss_threads": 1}
            for d in (384, 192, 96, 48):
                spec = IndexSpec(dim=d if d < dv.shape[1] else None)
                ours(f"{label} fp32" + (f" cut to {d}" if d < dv.shape[1] else ""), label, dv, tq, spec, settings)

    fp32 = rows[0]
    for r in rows:
        r["ndcg_vs_fp32"] = r["ndcg@10"] / fp32["ndcg@10"]
        r["ram_vs_fp32"] = r["ram_bytes_per_doc"] / fp32["ram_bytes_per_doc"]
    for label in ("plain fine-tuned", "matryoshka fine-tuned"):
        full = next((r for r in rows if r["system"] == f"{label} fp32"), None)
        for r in rows:
            if full is not None and r["group"] == label:
                r["ndcg_vs_own_full"] = r["ndcg@10"] / full["ndcg@10"]
    png = RESULTS / "compression_scifact.png"
    plot(rows, png)
    notes = (
        f"SciFact test ({len(qids)} queries, {len(doc_ids)} documents), all-MiniLM-L6-v2 vectors cached by "
        "benchmarks/_vectors.py. ram_bytes_per_doc = faiss.index bytes / documents (for binary rows the rescoring "
        "vectors stay on disk, memory-mapped: disk_bytes_per_doc); the fp32 flat index is 1,536 B/doc + header. "
        f"Rescore factor {f} unless the name says otherwise; p50_ms is batch-1 top-10 vector search, query "
        "encoding excluded; build_s is IndexStore.build from vectors (no encoding). PQ rows probe every IVF list. "
        "ndcg_vs_fp32: against the zero-shot fp32 row; ndcg_vs_own_full: against the same model's full 384-d "
        f"vectors. Fine-tuning: SciFact train, {args.epochs} epoch(s), lr {args.lr}, batch {args.batch_size}, "
        f"seed 0, attention dropout 0, matryoshka {MRL_DIMS} (weights 1) vs none; training wall s: {train_walls}. "
        f"Load average at the end: {load_average():.1f}. Plot: {png.name}."
    )
    write_results("compression_scifact", rows, notes=notes)


if __name__ == "__main__":
    main()
