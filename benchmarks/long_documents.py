"""Long documents: truncation (each document's first window, as before passages) against passages (a vector per
passage, a document scored by its best: MaxP), dense, BM25 and hybrid, with the defaults of ``tt.Index.build``.

Two collections, both from SciFact (BEIR, CC BY 4.0; ../shared/data/scifact):

- ``joined``: SciFact's abstracts joined ten to a document in a seeded random order (every abstract relevant to a
  test query, plus random others up to ``--abstracts``), so relevant parts sit at every position 1-10 of documents of
  ~2.5k tokens. A query's relevant document is the one holding its relevant abstract; its metrics are reported by
  that abstract's position: first in its document, or later.
- ``scifact``: SciFact test as it is (71% of its documents are longer than MiniLM's 256-token window).

Also the build time, index bytes per document and batch-1 query latency (dense, p50) of each setting.

    python benchmarks/long_documents.py [--parts joined,scifact] [--abstracts 1000]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402

MODES = ("dense", "bm25", "hybrid")
GROUP = 10


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def joined_collection(corpus, queries, qrels, n_abstracts: int, seed: int = 0):
    """(documents, {qid: text}, {(qid, doc_id): position}) of SciFact abstracts joined ``GROUP`` to a document."""
    import numpy as np

    relevant = sorted({d for rel in qrels.values() for d in rel})
    rng = np.random.default_rng(seed)
    others = [d for d in corpus if d not in set(relevant)]
    fill = list(rng.choice(others, size=max(0, n_abstracts - len(relevant)), replace=False))
    chosen = relevant + fill
    order = [chosen[i] for i in rng.permutation(len(chosen))]
    docs, where = [], {}
    for g in range(0, len(order), GROUP):
        parts = order[g : g + GROUP]
        doc_id = f"J{g // GROUP:04d}"
        text = "\n\n".join(f"{corpus[p].title}. {corpus[p].text}" for p in parts)
        docs.append({"_id": doc_id, "title": "", "text": text})
        for pos, p in enumerate(parts):
            where[p] = (doc_id, pos)
    pairs = {}
    for q, rel in qrels.items():
        for d in rel:
            doc_id, pos = where[d]
            pairs[(q, doc_id)] = min(pos, pairs.get((q, doc_id), GROUP))
    return docs, {q: queries[q] for q in qrels}, pairs


def pair_metrics(run: dict, pairs: dict) -> dict:
    """recall@10 and NDCG@10 (one relevant document) per pair, averaged by the relevant part's position."""
    out = {}
    for name, keep in (("first", lambda p: p == 0), ("later", lambda p: p > 0)):
        rec, ndcg = [], []
        for (q, d), pos in pairs.items():
            if not keep(pos):
                continue
            ranked = sorted(run.get(q, {}).items(), key=lambda kv: -kv[1])[:10]
            rank = next((i for i, (doc, _) in enumerate(ranked) if doc == d), None)
            rec.append(1.0 if rank is not None else 0.0)
            ndcg.append(1.0 / math.log2(rank + 2) if rank is not None else 0.0)
        out[name] = (statistics.fmean(rec), statistics.fmean(ndcg), len(rec))
    return out


def build(tt, path: Path, docs, passages: bool):
    t0 = time.perf_counter()
    index = tt.Index.build(path, docs, bm25=True, passages=passages, show_progress=True)
    return index, time.perf_counter() - t0


def latency(index, texts: list[str]) -> float:
    index.search(texts[0], k=10, mode="dense")  # warm-up
    times = []
    for t in texts[:50]:
        t0 = time.perf_counter()
        index.search(t, k=10, mode="dense")
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run_joined(tt, data, work: Path, n_abstracts: int) -> list[dict]:
    docs, queries, pairs = joined_collection(data.corpus, data.queries, data.qrels, n_abstracts)
    rows = []
    for passages in (False, True):
        index, build_s = build(tt, work / f"joined-{passages}", docs, passages)
        info = index.info()
        for mode in MODES:
            run = index.run(queries, k=10, mode=mode)
            m = pair_metrics(run, pairs)
            rows.append({
                "collection": f"joined ({len(docs)} docs of {GROUP} abstracts)", "system": mode,
                "setting": "passages" if passages else "truncation",
                "recall@10 first": round(m["first"][0], 4), "recall@10 later": round(m["later"][0], 4),
                "later/first": round(m["later"][0] / m["first"][0], 3) if m["first"][0] else None,
                "ndcg@10 first": round(m["first"][1], 4), "ndcg@10 later": round(m["later"][1], 4),
                "pairs first/later": f"{m['first'][2]}/{m['later'][2]}",
                "vectors": info["num_vectors"], "build_s": round(build_s, 1),
                "bytes/doc": round(_size(Path(index.path)) / len(docs)),
                "p50_ms (dense)": round(latency(index, list(queries.values())), 2),
            })
            print(rows[-1], flush=True)
    return rows


def run_scifact(tt, data, work: Path) -> list[dict]:
    rows = []
    for passages in (False, True):
        index, build_s = build(tt, work / f"scifact-{passages}", data, passages)
        info = index.info()
        p50 = latency(index, list(data.queries.values()))
        for mode in MODES:
            res = tt.evaluate(index, data, mode=mode)
            rows.append({"collection": "scifact test", "system": mode,
                         "setting": "passages" if passages else "truncation",
                         "ndcg@10": round(res.metrics["ndcg@10"], 4), "recall@100": round(res.metrics["recall@100"], 4),
                         "vectors": info["num_vectors"], "build_s": round(build_s, 1),
                         "bytes/doc": round(_size(Path(index.path)) / len(data.corpus)), "p50_ms (dense)": round(p50, 2)})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="joined,scifact")
    parser.add_argument("--abstracts", type=int, default=1000, help="abstracts joined (every relevant one + random)")
    args = parser.parse_args()
    import twotower as tt

    data = tt.load_beir(DATA / "scifact", split="test")
    work = Path(tempfile.mkdtemp(prefix="long-docs-"))
    rows = []
    try:
        parts = args.parts.split(",")
        if "joined" in parts:
            rows += run_joined(tt, data, work, args.abstracts)
        if "scifact" in parts:
            rows += run_scifact(tt, data, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = "long_documents" if set(args.parts.split(",")) == {"joined", "scifact"} else \
        "long_documents_" + "_".join(sorted(args.parts.split(",")))
    write_results(name, rows, notes=(
        "all-MiniLM-L6-v2 (256-token window), `tt.Index.build` defaults (flat, BM25, passages of up to 256 tokens "
        "overlapping by 32; truncation: `passages=False`), hybrid λ 0.5 min-max. joined: recall@10 / NDCG@10 of "
        "(query, document) pairs by the position of the relevant abstract in its document (first, or 2nd-10th); "
        "later/first: the ratio of recall@10. bytes/doc: the index folder (vectors, FAISS, documents, BM25) / "
        "documents. p50_ms: batch-1 dense `Index.search`, k=10, 50 queries."))


if __name__ == "__main__":
    main()
