"""What a Python user gets from ``tt.Index.open(path).search(q)`` with the defaults, against the search service
(``twotower serve``, its own defaults) on the same index, in one run: batch-1 p50/p99 of each, taking turns query
by query, and the time from ``Index.open`` to the first result in a new process, with the on-disk ONNX export cache
empty (the first process ever) and filled (every later one).

    python benchmarks/index_latency.py --docs 1000 --queries 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import DATA, load_average, write_results

FIRST = """
import json, sys, time
t0 = time.perf_counter()
import twotower as tt
t1 = time.perf_counter()
index = tt.Index.open(sys.argv[1])
index.search(sys.argv[2], k=10)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_to_first_hit_s": t2 - t1, "torch": "torch" in sys.modules}))
"""


def first_search(index: Path, query: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", FIRST, str(index), query], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--docs", type=int, default=1000, help="SciFact documents indexed (the first N)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    import httpx

    import twotower as tt

    load_start = load_average()
    work = args.work or Path(tempfile.mkdtemp(prefix="index-latency-"))
    ds = tt.load_beir(args.data, split="test")
    docs = list(ds.corpus.values())[: args.docs]
    queries = list(ds.queries.values())[: args.queries]
    index_dir = work / "index"
    if not (index_dir / "CURRENT").exists():
        tt.Index.build(index_dir, docs, show_progress=True)  # the defaults: passages, BM25
    home = work / "home"
    shutil.rmtree(home, ignore_errors=True)
    env = {**os.environ, "TWOTOWER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    cold = first_search(index_dir, queries[0], env)
    warm = [first_search(index_dir, q, env) for q in queries[1:4]]

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "twotower.cli", "serve", "--index", str(index_dir), "--port",
                               str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        for _ in range(600):
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        os.environ["TWOTOWER_HOME"] = str(home)
        index = tt.Index.open(index_dir)
        for q in queries[:10]:  # warm-up, both
            index.search(q, k=10)
            client.post("/search", json={"query": q, "k": 10}).raise_for_status()
        py, http = [], []
        for q in queries:  # turns, query by query
            t = time.perf_counter()
            index.search(q, k=10)
            py.append(time.perf_counter() - t)
            t = time.perf_counter()
            client.post("/search", json={"query": q, "k": 10}).raise_for_status()
            http.append(time.perf_counter() - t)
        mode = index.resolve()[0]
    finally:
        server.terminate()
        server.wait(timeout=30)
    rows = []
    for name, times in (("twotower serve (HTTP, loopback)", http), ("tt.Index.open(path).search (defaults)", py)):
        ms = np.asarray(times) * 1000
        rows.append({"system": name, "mode": mode, "p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99))})
    rows[1]["p50_vs_server"] = rows[1]["p50_ms"] / rows[0]["p50_ms"]
    rows.append({"system": "new process: Index.open to first hit, no cached export", "first_search_s":
                 cold["open_to_first_hit_s"], "torch_loaded": cold["torch"]})
    rows.append({"system": "new process: Index.open to first hit, export cached", "first_search_s":
                 float(np.median([w["open_to_first_hit_s"] for w in warm])), "torch_loaded": any(w["torch"] for w in warm),
                 "import_s": float(np.median([w["import_s"] for w in warm]))})
    write_results("index_latency", rows, notes=(
        f"{len(docs)} SciFact documents indexed with tt.Index.build's defaults (all-MiniLM-L6-v2, passages, BM25); "
        f"{len(queries)} SciFact test queries, k=10, after 10 warm-up queries, Python and HTTP taking turns query by "
        f"query in one process pair; first-search rows: a new Python process each (median of 3 when cached). Load "
        f"average {load_start:.1f} at start, {load_average():.1f} at end (2 cores)."))
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
