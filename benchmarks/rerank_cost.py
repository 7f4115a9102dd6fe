"""What re-ranking a top 100 with a MiniLM cross-encoder costs per query on this machine (CPU).

The cost depends on the architecture and the text lengths only, not on the weights, so an untrained cross-encoder
built from all-MiniLM-L6-v2 (max length 192, as `twotower train-reranker` and `twotower fit --reranker` build it)
re-scores 100 SciFact test documents for each of 9 queries (one more first, to warm up).

    python benchmarks/rerank_cost.py [--queries 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, write_results  # noqa: E402


def main() -> None:
    from sentence_transformers import CrossEncoder

    from twotower.data.beir import BeirDataset
    from twotower.encoders.backbone import read_layout, resolve_model
    from twotower.retrieval.rerank import Reranker

    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--depth", type=int, default=100)
    args = ap.parse_args()
    ds = BeirDataset.load(DATA / "scifact", "test")
    qids, docs = list(ds.queries)[: args.queries], list(ds.corpus)
    run = {q: {d: -i for i, d in enumerate(docs[j * args.depth:(j + 1) * args.depth])} for j, q in enumerate(qids)}
    with tempfile.TemporaryDirectory() as tmp:
        CrossEncoder(read_layout(resolve_model(None)).transformer_dir, num_labels=1, max_length=192,
                     local_files_only=True).save(tmp)
        ce = Reranker(tmp, max_length=192)
        text = lambda d: ds.corpus[d].full_text  # noqa: E731
        ce.rerank({qids[0]: run[qids[0]]}, ds.queries, text, top_n=args.depth, show_progress=False)  # warm-up
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        ce.rerank({q: run[q] for q in qids[1:]}, ds.queries, text, top_n=args.depth, show_progress=False)
        ms = 1000 * (time.perf_counter() - t0) / (len(qids) - 1)
    rows = [{"system": f"MiniLM cross-encoder, top {args.depth}", "ms_per_query": round(ms, 1),
             "pairs_per_s": round(1000 * args.depth / ms, 1), "load_at_start": round(load, 2)}]
    write_results("rerank_cost", rows, notes=f"{len(qids) - 1} SciFact test queries × {args.depth} documents, bf16 "
                  "autocast where fast (precision auto), batch 32, max length 192, 2 threads; the 2 cores are shared "
                  "with other jobs (load average at the start in the table).")


if __name__ == "__main__":
    main()
