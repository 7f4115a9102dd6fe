"""Long documents as passages on Milvus against the local index (issue #52): the same documents, model and passage
window built twice, as a local flat index and as a Milvus Lite FLAT collection (a row per passage), with BM25; each
query's top 10 compared in dense, hybrid and RRF modes: the share of queries whose ten ids (in order) and best
passages' spans are identical, and the largest score difference.

The default model (all-MiniLM-L6-v2, fp32), SciFact's first ``--docs`` documents (400) split at ``--window`` tokens
(64, so that most abstracts make several passages) and its first ``--queries`` queries (100).

    python benchmarks/milvus_passages.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

DATA = Path("/work/shared/data/scifact")
NOTES = """A row per passage on Milvus, scored by its best passage, returns what the local index returns: the same
ids in the same order, the same best passage (its span into the text) and the same scores up to float32 rounding.
Build times were taken on a shared, loaded machine."""


def main() -> None:
    import twotower as tt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--window", type=int, default=64)
    args = parser.parse_args()
    data = Path(args.data)
    if not (data / "corpus.jsonl").is_file():
        raise SystemExit(f"{data}: no corpus.jsonl (a BEIR folder, e.g. SciFact)")
    with open(data / "corpus.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for _, line in zip(range(args.docs), f)]
    with open(data / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for _, line in zip(range(args.queries), f)]
    root = Path(tempfile.mkdtemp())
    opts = {"bm25": True, "passage_window": args.window, "show_progress": False, "precision": "fp32"}
    built = {}
    for name, extra in (("local", {}), ("milvus", {"backend": "milvus", "uri": str(root / "m.db"),
                                                    "collection": "passages"})):
        t0 = time.perf_counter()
        built[name] = tt.Index.build(root / name, docs, **opts, **extra)
        built[name + "_s"] = time.perf_counter() - t0
    local, milvus = built["local"], built["milvus"]
    rows = []
    for mode in ("dense", "hybrid", "rrf"):
        a = local.search(queries, k=10, mode=mode)
        b = milvus.search(queries, k=10, mode=mode)
        rows.append({
            "system": f"{mode}: local flat vs Milvus Lite FLAT",
            "documents": milvus.info()["num_docs"], "passages": milvus.info()["num_passages"],
            "local_passages": local.info()["num_passages"],
            "same_top10_ids": sum([h.id for h in x] == [h.id for h in y] for x, y in zip(a, b)) / len(queries),
            "same_passage_spans": sum([(h.passage.start, h.passage.end) for h in x]
                                      == [(h.passage.start, h.passage.end) for h in y]
                                      for x, y in zip(a, b)) / len(queries),
            "max_score_diff": max(abs(h.score - g.score) for x, y in zip(a, b) for h, g in zip(x, y)),
            "build_s_local": round(built["local_s"], 1), "build_s_milvus": round(built["milvus_s"], 1),
        })
    print(json.dumps(rows, indent=2))
    _common.write_results("milvus_passages", rows, notes=NOTES)


if __name__ == "__main__":
    main()
