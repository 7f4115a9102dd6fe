"""Does a strongly consistent query on Milvus Lite see every row acknowledged before it began, while another client
writes? (issue #54: why twotower's writes never flush Milvus Lite.)

A Milvus Lite server (``python -m milvus_lite server``) and three phases of ``--seconds`` each, a reader querying all
along and counting the reads that returned fewer rows than had been acknowledged when the read began:

- ``insert + flush``: a writer inserts one row and flushes, again and again;
- ``insert``: the same without flushes;
- ``other rows``: a writer inserts, upserts and deletes (by filter) rows of its own, never flushing, while the rows
  the reader counts stay as they are.

    python benchmarks/experiments/milvus_lite_flush.py [--seconds 40]

Results: results/milvus_lite_flush.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import load_average, write_results  # noqa: E402


def _server(folder: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", folder, "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("the Milvus Lite server did not start")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def _collection(client, name: str) -> None:
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("kind", DataType.INT64)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
    params = client.prepare_index_params()
    params.add_index("vec", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=params, consistency_level="Strong")


def phase(uri: str, name: str, mode: str, seconds: float) -> dict:
    from pymilvus import MilvusClient

    setup = MilvusClient(uri)
    _collection(setup, name)
    setup.insert(name, [{"pk": f"s{i}", "kind": 1, "vec": [0.0, 0.0]} for i in range(20)])
    acked, stop = {"n": 20}, threading.Event()
    counts = {"reads": 0, "short": 0, "writes": 0}

    def writer() -> None:
        client, rng, n = MilvusClient(uri), random.Random(0), 20
        while not stop.is_set():
            if mode == "other rows":
                t = rng.randrange(1, 2**62)
                client.insert(name, [{"pk": f"o{t:x}:{i}", "kind": 2, "vec": [0.0, 0.0]} for i in range(3)])
                client.upsert(name, [{"pk": f"o{t:x}:0", "kind": 3, "vec": [1.0, 0.0]}])
                client.delete(name, filter=f'pk like "o{t:x}:%"')
            else:
                client.insert(name, [{"pk": f"s{n}", "kind": 1, "vec": [0.0, 0.0]}])
                n += 1
                acked["n"] = n
                if mode == "insert + flush":
                    client.flush(name)
            counts["writes"] += 1

    def reader() -> None:
        client = MilvusClient(uri)
        while not stop.is_set():
            before = acked["n"]
            got = client.query(name, filter="kind == 1", output_fields=["pk"])
            counts["reads"] += 1
            counts["short"] += len(got) < before

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return {"system": f"milvus-lite, writer: {mode}", **counts,
            "short_share": round(counts["short"] / max(1, counts["reads"]), 4), "load_1m": round(load_average(), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0)
    args = ap.parse_args()
    import milvus_lite

    with tempfile.TemporaryDirectory(prefix="milvus-lite-flush-") as folder:
        proc, uri = _server(folder)
        try:
            rows = []
            for i, mode in enumerate(("insert + flush", "insert", "other rows")):
                rows.append(phase(uri, f"c{i}", mode, args.seconds))
                print(rows[-1], flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    version = getattr(milvus_lite, "__version__", "?")
    write_results("milvus_lite_flush", rows, extra={"milvus_lite": version, "seconds": args.seconds}, notes=(
        f"Milvus Lite {version} server, one writer and one reader (strongly consistent queries), {args.seconds:g} s per "
        "row. short: reads that returned fewer of the counted rows than had been acknowledged before the read began. "
        "Milvus Lite's flush swaps its memtable for an empty one before the flushed rows reach its segment cache "
        "(milvus_lite/engine/collection.py, `_trigger_flush`), and a query reads only the segment cache and the live "
        "memtable: so twotower's writes never flush Milvus Lite (`twotower.retrieval.milvus.client.persist`)."))


if __name__ == "__main__":
    main()
