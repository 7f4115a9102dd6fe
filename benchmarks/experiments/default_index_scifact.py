"""What a user gets from the defaults on SciFact (issue #70's done-when): ``tt.Index.build(path, ds)`` with no
options, then ``tt.evaluate(index, ds)`` and ``index.search(q)`` with none either — which mode the search chose,
and its NDCG@10, beside the same index searched dense-only and BM25-only (one build, one run).

    python benchmarks/experiments/default_index_scifact.py --work <work-dir> [--reuse]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DATA, load_average, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=DATA / "scifact")
    ap.add_argument("--reuse", action="store_true", help="evaluate the index --work holds instead of building again")
    args = ap.parse_args()
    import twotower as tt

    ds = tt.load_beir(args.data, split="test")
    path = args.work / "index"
    load_start = load_average()
    build_s = None
    timing = args.work / "build.json"
    if args.reuse and (path / "CURRENT").exists():
        index = tt.Index.open(path)
        build_s = json.loads(timing.read_text())["build_s"] if timing.exists() else None
    else:
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        index = tt.Index.build(path, ds)  # the defaults, nothing else
        build_s = round(time.perf_counter() - t0, 1)
        timing.write_text(json.dumps({"build_s": build_s}))
    query = next(iter(ds.queries.values()))
    default_mode = index.resolve()[0]  # the mode a search with no options takes
    hit = index.search(query, k=1)[0]  # no options: the mode, passages and runtime the index chooses
    rows = []
    for label, mode in (("defaults (no options)", None), ("dense", "dense"), ("bm25", "bm25"), ("hybrid", "hybrid")):
        result = tt.evaluate(index, ds, mode=mode) if mode else tt.evaluate(index, ds)
        rows.append({"system": f"tt.Index.build(path, ds) + evaluate: {label}",
                     "mode": result.choices.get("mode") if getattr(result, "choices", None) else mode,
                     "ndcg@10": round(result.metrics["ndcg@10"], 4),
                     "recall@100": round(result.metrics["recall@100"], 4)})
    # the Index's own searches with no options (its query runtime: ONNX where "auto" picks it), scored alike
    run = index.run({q: ds.queries[q] for q in ds.qrels}, k=100)
    scored = tt.score_run(run, ds, ["ndcg@10", "recall@100"])
    rows.insert(0, {"system": "tt.Index.build(path, ds) + index.run(queries): no options", "mode": default_mode,
                    "ndcg@10": round(scored["ndcg@10"], 4), "recall@100": round(scored["recall@100"], 4)})
    info = index.info()
    notes = (f"SciFact test (300 queries), all-MiniLM-L6-v2, every choice tt.Index.build's default: "
             f"{info['num_vectors']} vectors for {len(index)} documents (passages), BM25 {bool(info.get('bm25'))}, "
             f"default search mode {default_mode}; build {build_s} s. A search with no options returned "
             f"{hit.id} with its passage at {hit.passage.start}-{hit.passage.end}. Load average {load_start:.1f} at "
             f"start, {load_average():.1f} at end (2 cores).")
    write_results("default_index_scifact", rows, notes=notes, extra={"build_s": build_s, "info": info})
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
