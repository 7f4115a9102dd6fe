"""Batch-1 query latency of passages against truncation on SciFact: one dense ``Index.search(query, k=10)`` at a time,
the settings interleaved query by query (so load from other processes falls on all of them alike), over the indexes
that ``benchmarks/passage_windows.py`` built into its cache. Reports p50 / p90 in ms and each setting's p50 as a ratio
to truncation's, measured in the same run; also the index folder's bytes per document.

    python benchmarks/passage_latency.py [--queries 300] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402
from passage_windows import SETTINGS  # noqa: E402


def _bytes(path: Path) -> int:
    live = path / "versions" / (path / "CURRENT").read_text().strip()
    return sum(f.stat().st_size for f in live.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", type=Path, default=Path(__file__).resolve().parents[1] / ".cache" / "passage-windows")
    args = parser.parse_args()
    import numpy as np

    import twotower as tt

    found = [s for s in SETTINGS if (args.cache / s).is_dir()]
    if "truncation" not in found:
        sys.exit(f"--cache {args.cache}: run benchmarks/passage_windows.py first (it builds the indexes)")
    data = tt.load_beir(DATA / "scifact", split="test")
    queries = list(data.queries.values())[: args.queries]
    indexes = {s: tt.Index.open(args.cache / s) for s in found}
    for index in indexes.values():  # load the encoder and read the files once
        index.search(queries[0], k=10, mode="dense")
    times: dict[str, list[float]] = {s: [] for s in found}
    load_before = os.getloadavg()
    for i, q in enumerate(queries):
        order = found if i % 2 == 0 else found[::-1]
        for s in order:
            t0 = time.perf_counter()
            indexes[s].search(q, k=10, mode="dense")
            times[s].append((time.perf_counter() - t0) * 1000)
    base = statistics.median(times["truncation"])
    rows = [{"system": s, "vectors": indexes[s].info()["num_vectors"],
             "bytes/doc": round(_bytes(args.cache / s) / len(data.corpus)),
             "p50_ms": round(statistics.median(t), 2), "p90_ms": round(float(np.quantile(t, 0.9)), 2),
             "p50 / truncation": round(statistics.median(t) / base, 2)} for s, t in times.items()]
    for r in rows:
        print(r)
    write_results("passage_latency", rows, notes=(
        f"SciFact (5,183 documents), all-MiniLM-L6-v2, flat index, `Index.search(query, k=10, mode='dense')` one "
        f"query at a time ({len(queries)} test queries; the query's encoding included), the settings interleaved "
        f"query by query. Settings as in passage_windows (truncation: `passages=False`; max256: the default "
        f"passages; first256: `passage_score='first'`; max128: `passage_window=128`). bytes/doc: the live version's "
        f"files (vectors, FAISS, documents, BM25) / documents. Load average before: "
        f"{' '.join(f'{x:.2f}' for x in load_before)}; after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}."))


if __name__ == "__main__":
    main()
