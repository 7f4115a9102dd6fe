"""The Milvus server's memory per document for each vector storage twotower maps to Milvus (issue #54).

For each storage a fresh Milvus Lite server (``python -m milvus_lite server``) gets an index of N documents with
random 384-d unit vectors and no text or BM25 (so that the figures are the vectors' and the rows' own), is loaded and
searched, and then measured: the server process's resident memory (anonymous and file-backed, from
``/proc/<pid>/smaps_rollup``) minus what the same server held with an empty collection of that schema, and the size
of its data folder (segment files, index files, write-ahead log). Divided by N.

Storages: ``fp32`` (FLOAT_VECTOR, FLAT), ``int8`` (FLOAT_VECTOR with an IVF_SQ8 index of one list: what
``--vectors int8`` on Milvus builds), and the same two with HNSW (HNSW, HNSW_SQ). Milvus Lite 3.2.2 has no
BINARY_VECTOR field: ``--engine server`` measures ``fp32`` FLAT, ``int8`` IVF_SQ8 and ``binary`` BIN_FLAT (sign bits
plus the int8 rescoring codes in a VARCHAR) on PyPI's standalone Milvus 2.3.5 server (one process with its embedded
etcd: ``tests/milvus_server.py``), into ``results/milvus_memory_server.*``.

    python benchmarks/milvus_memory.py --docs 100000
    python benchmarks/milvus_memory.py --docs 100000 --engine server --kinds flat --settle 30
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import _common  # noqa: E402

DIM = 384
SETTLE_S = 2.0  # seconds between the searches and the measurement (--settle)


def _rss(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if parts[0] in ("Rss:", "Anonymous:", "Pss_File:", "Pss_Anon:"):
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def _folder(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(kind: str, vectors: str, n: int, work: Path) -> dict:
    """One storage on a fresh Milvus Lite server."""
    data = work / f"data_{kind}_{vectors}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data), "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"
    try:
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            time.sleep(0.2)
        return _fill(uri, proc.pid, data, kind, vectors, n, work)
    finally:
        proc.terminate()
        proc.wait(60)


def measure_server(kind: str, vectors: str, n: int, work: Path) -> dict:
    """One storage on a fresh standalone Milvus 2.3.5 server (no BM25: 2.3 has no sparse vectors)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from milvus_server import milvus_server

    with milvus_server(work / f"server_{kind}_{vectors}") as server:
        return _fill(server.uri, server.pid, server.folder, kind, vectors, n, work, http=server.http)


def _go_idle(http: str) -> int:
    """Bytes the server's Go heap holds without using them (garbage collected, not yet returned to the system), after
    a forced collection (``/debug/pprof/heap?gc=1``): part of the RSS that is no index's or row's."""
    import re
    import urllib.request

    urllib.request.urlopen(f"{http}/debug/pprof/heap?gc=1", timeout=60).read()
    text = urllib.request.urlopen(f"{http}/metrics", timeout=60).read().decode()
    value = {name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))
             for name in ("go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes")}
    return int(value["go_memstats_heap_idle_bytes"] - value["go_memstats_heap_released_bytes"])


def _fill(uri: str, pid: int, data: Path, kind: str, vectors: str, n: int, work: Path, http: str | None = None) -> dict:
    from twotower.retrieval.index.kinds import IndexSpec
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus.client import forget_client
    from twotower.retrieval.milvus.store import MilvusStore

    rng = np.random.default_rng(0)
    spec = IndexSpec(kind=kind, vectors=vectors)
    one = rng.standard_normal((1, DIM)).astype(np.float32)
    empty = MilvusStore.build(work / f"e_{kind}_{vectors}", NewDocs(["e0"], [""], [""], one / np.linalg.norm(one)),
                              model={"name": "random"}, spec=spec, uri=uri, collection="empty",
                              show_progress=False)
    empty.search(one, 1)
    idle_before = _go_idle(http) if http else 0
    before = _rss(pid)
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    t0 = time.perf_counter()
    store = MilvusStore.build(work / f"i_{kind}_{vectors}", NewDocs([f"d{i}" for i in range(n)], [""] * n,
                                                                     [""] * n, v),
                              model={"name": "random"}, spec=spec, uri=uri, collection="big", show_progress=False)
    build_s = time.perf_counter() - t0
    del v
    store.search(rng.standard_normal((8, DIM)).astype(np.float32), 10)
    time.sleep(SETTLE_S)
    idle_after = _go_idle(http) if http else 0
    after = _rss(pid)
    forget_client(uri)
    go_idle = {"rss_less_go_idle_bytes_per_doc": round((after["Rss"] - idle_after - before["Rss"] + idle_before) / n, 1),
               "go_idle_bytes_per_doc": round((idle_after - idle_before) / n, 1)} if http else {}
    return {"system": f"{vectors} {store.manifest['milvus']['index_type']}", "docs": n, **go_idle,
            "rss_bytes_per_doc": round((after["Rss"] - before["Rss"]) / n, 1),
            "anon_bytes_per_doc": round((after["Anonymous"] - before["Anonymous"]) / n, 1),
            "file_backed_bytes_per_doc": round((after["Pss_File"] - before["Pss_File"]) / n, 1),
            "folder_bytes_per_doc": round(_folder(data) / n, 1), "build_s": round(build_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--kinds", default="flat,hnsw")
    ap.add_argument("--engine", choices=["lite", "server"], default="lite")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before measuring (a Go server returns "
                    "freed heap to the system over tens of seconds)")
    args = ap.parse_args()
    global SETTLE_S
    SETTLE_S = args.settle
    rows = []
    server = args.engine == "server"
    with tempfile.TemporaryDirectory(prefix="milvus-memory-") as work:
        for kind in args.kinds.split(","):
            for vectors in ("fp32", "int8", "binary") if server else ("fp32", "int8"):
                if vectors == "binary" and kind == "hnsw":
                    continue  # Milvus indexes binary vectors as BIN_FLAT or BIN_IVF_FLAT
                rows.append((measure_server if server else measure)(kind, vectors, args.docs, Path(work)))
                print(rows[-1], flush=True)
    _common.write_results("milvus_memory_server" if server else "milvus_memory", rows,
                          notes=SERVER_NOTES if server else NOTES, extra={"load_average_1m": _common.load_average()})


NOTES = """\
Per document, from one server per storage (N documents, 384-d random unit vectors, no text, no BM25): `rss` is the
Milvus Lite server process's resident memory after the build, the load and 8 searches, minus the same server's with
a one-document collection of that schema; `anon` the anonymous part of it (heap: the index, the loaded rows),
`file_backed` the file-backed part (memory-mapped segment and index files, proportional share); `folder` the server's
data folder on disk (segment files, index files, write-ahead log). fp32 vectors are 1,536 bytes, int8 codes 384. A
Milvus server keeps the raw FLOAT_VECTOR field on disk beside a scalar-quantized index; how much of it is resident
depends on the server (Milvus Lite: see the figures). Milvus Lite 3.2.2 has no FLOAT16_VECTOR or BINARY_VECTOR field,
so binary vectors are measured on the standalone Milvus 2.3.5 server instead (`--engine server`,
`milvus_memory_server.md`); half precision stays local (FAISS: 768 bytes per document, `compression_1m.md`).
"""

SERVER_NOTES = """\
Per document, from one standalone Milvus 2.3.5 server per storage (PyPI `milvus==2.3.5`: one process with its
embedded etcd; N documents, 384-d random unit vectors, no text, no BM25): `rss` is the server process's resident
memory after the build, the load and 8 searches, minus the same server's with a one-document collection of that
schema; `anon` the anonymous part (heap: loaded segments, indexes), `file_backed` the file-backed part (proportional
share of mapped files); `folder` the server's data folder on disk (etcd, write-ahead log, segment and index files).
The server is written in Go: after a build its heap holds garbage-collected memory it returns to the system only
over minutes (the same fp32 build measured 11,888 bytes per document 2 s after its searches and 3,821 after 60 s), so
each measurement forces a collection first (`/debug/pprof/heap?gc=1`) and `go_idle` is what the Go heap then still
holds unused and unreturned (`go_memstats_heap_idle_bytes − heap_released_bytes`, from `/metrics`);
`rss_less_go_idle` is `rss` without it: the figure to compare.
fp32 vectors are 1,536 bytes, int8 codes 384; binary rows hold the sign bits (48 bytes) and the int8 rescoring codes
as base64 text (512 characters) in a VARCHAR field, which Milvus keeps in memory with the loaded segment. Each row
also holds twotower's bookkeeping fields (key, id, write numbers, span, empty metadata JSON).
"""

if __name__ == "__main__":
    main()
