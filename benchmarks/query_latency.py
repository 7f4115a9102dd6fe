"""Batch-1 query latency on SciFact: sentence-transformers against twotower's query paths, in one run.

One query = tokenize + encode + exact top-10 over all 5183 SciFact document vectors (the default
model's fp32 vectors, cached by ``_vectors.py``), p50/p99 in ms over the test queries, the systems
taking turns in blocks of 50 queries (each block back to back, as a server would run it). Systems:

- ``sentence-transformers fp32``: ``SentenceTransformer.encode([q])``;
- ``twotower torch fp32``: ``encode_texts`` on the query tower (what ``twotower search`` uses);
- ``twotower onnx-query``: the query tower on ONNX Runtime (``twotower serve``'s default).

Each thread count in ``--threads`` is one set of rows (torch and ORT both use that many threads). The
ONNX rows also carry the median of each part (tokenize, ORT run, exact search), and every twotower row
its NDCG@10 on SciFact test with its own query vectors against the same document vectors.

    python benchmarks/query_latency.py                  # 300 test queries, 1 and 2 threads (~2 min)
    python benchmarks/query_latency.py --threads 2 --queries 100
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import DATA, load_average, query_latency, vector_metrics, write_results
from _vectors import scifact_vectors
from twotower.data.beir import BeirDataset
from twotower.encoders.inference import encode_texts
from twotower.encoders.onnx_runtime import OnnxTower
from twotower.encoders.towers import DualEncoder
from twotower.retrieval.dense import exact_search


def onnx_parts(fast: OnnxTower, doc_vecs: np.ndarray, queries: list[str]) -> dict[str, float]:
    """Median ms of the ONNX path's parts: tokenize, ORT run (with pooling etc. in the graph), search."""
    parts = {"tokenize_ms": [], "encode_ms": [], "search_ms": []}
    for q in queries:
        t0 = time.perf_counter()
        feed = fast.tokenizer([q], truncation=True, max_length=fast.max_length, return_tensors="np",
                              return_token_type_ids=False)
        t1 = time.perf_counter()
        vec = fast.session.run(None, {k: v.astype(np.int64) for k, v in feed.items() if k in fast.inputs})[0]
        t2 = time.perf_counter()
        exact_search(vec, doc_vecs, 10)
        t3 = time.perf_counter()
        for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[key].append(dt * 1000)
    return {k: float(np.median(v)) for k, v in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--queries", type=int, default=300, help="test queries timed (the first N)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    args = ap.parse_args()
    load_start = load_average()

    from sentence_transformers import SentenceTransformer

    from twotower.encoders.backbone import default_model_path

    ds = BeirDataset.load(args.data, "test")
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    doc_ids, doc_vecs, _, _ = scifact_vectors("fp32")
    model = DualEncoder.load()
    tower = model.query_tower
    st = SentenceTransformer(str(default_model_path()), device="cpu")
    st.max_seq_length = model.query_max_length
    timed = queries[: args.queries]

    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        fast = OnnxTower(tower, max_length=model.query_max_length, threads=threads)
        lat = query_latency({
            "sentence-transformers fp32": lambda q: st.encode([q], normalize_embeddings=True, convert_to_numpy=True,
                                                              show_progress_bar=False),
            "twotower torch fp32": lambda q: encode_texts(tower, [q], max_length=model.query_max_length,
                                                          precision="fp32", show_progress=False),
            "twotower onnx-query": lambda q: fast.encode([q]),
        }, doc_vecs, timed)
        ref = lat["sentence-transformers fp32"]["p50_ms"]
        encoders = {
            "twotower torch fp32": lambda: encode_texts(tower, queries, max_length=model.query_max_length,
                                                        precision="fp32", show_progress=False),
            "twotower onnx-query": lambda: fast.encode(queries),
        }
        for name, t in lat.items():
            row = {"system": name, "threads": threads, **t, "speedup_vs_st": ref / t["p50_ms"]}
            if name in encoders:
                row.update(vector_metrics(ds.qrels, qids, encoders[name](), doc_ids, doc_vecs, ("ndcg@10",), k=100))
            if name == "twotower onnx-query":
                row.update(onnx_parts(fast, doc_vecs, timed), max_abs_diff_vs_torch=fast.max_abs_diff)
            rows.append(row)
            print(row, flush=True)

    write_results("query_latency", rows, notes=(
        f"all-MiniLM-L6-v2, query max length {model.query_max_length}; {len(timed)} SciFact test queries timed "
        f"(mean {np.mean([len(x) for x in tower.tokenizer(timed)['input_ids']]):.1f} tokens), after 10 warm-up "
        f"queries; exact top-10 over {len(doc_ids)} fp32 document vectors. Load average {load_start:.1f} at start, "
        f"{load_average():.1f} at end (2 cores: compare rows of one run, not runs). speedup_vs_st = "
        "sentence-transformers' p50 / the row's p50 at the same thread count. tokenize_ms / encode_ms / search_ms: "
        "medians of the ONNX path's parts, timed separately. ndcg@10: SciFact test, that system's query vectors "
        "against the same document vectors. max_abs_diff_vs_torch: the ONNX export's check against the torch tower "
        "on probe texts."))


if __name__ == "__main__":
    main()
