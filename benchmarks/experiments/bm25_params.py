"""Sweep BM25 k1 and b on SciFact's *train* queries (never test) to choose the defaults.

    python benchmarks/experiments/bm25_params.py
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from twotower.data.beir import BeirDataset
from twotower.evaluation.metrics import evaluate
from twotower.retrieval.bm25 import BM25, BM25Params
from twotower.retrieval.dense import to_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common.py
from _common import DATA, write_results  # noqa: E402


def main() -> None:
    ds = BeirDataset.load(DATA / "scifact", "train")
    ids = list(ds.corpus)
    texts = [ds.corpus[i].full_text for i in ids]
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    rows = []
    for k1, b in itertools.product((0.9, 1.2, 1.5), (0.4, 0.6, 0.75, 0.9)):
        t0 = time.perf_counter()
        bm = BM25(BM25Params(k1=k1, b=b)).index(ids, texts, show_progress=False)
        scores, idx = bm.search(queries, 1000, show_progress=False)
        m = evaluate(ds.qrels, to_run(qids, ids, scores, idx), ("ndcg@10", "recall@100", "mrr@10", "p@1"))
        rows.append({"system": f"bm25 k1={k1} b={b}", "k1": k1, "b": b, **m, "wall_s": time.perf_counter() - t0})
        print(rows[-1], flush=True)
    write_results("bm25_params", rows, notes="SciFact train split (809 queries); the test split is not used.")


if __name__ == "__main__":
    main()
