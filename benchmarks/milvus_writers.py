"""Concurrent writers with random pauses at every step on one Milvus index (issue #54): many schedules.

The harness is the tests' (``tests/milvus_writers.py``): 2 or 3 writers doing an add, a replace and a remove each,
every step of every write pausing with probability ``p`` for up to ``pauses`` lease lengths, a reader sampling the
committed state all along. A schedule passes when no sample and not the end state shows part of a write, no failed
write ("another writer took over; nothing of this write is visible") shows anywhere, every successful one shows at
the end, and the BM25 statistics of every sampled write recount exactly from its rows.

Rows: ``in memory`` runs the schedules on ``FakeMilvus`` (each call atomic, as a strongly consistent Milvus's are;
leases of 20 ms, 8 schedules at once), ``milvus lite server`` on Milvus Lite's gRPC server (leases of 0.3 s).

    python benchmarks/milvus_writers.py --schedules 3000 --server-schedules 20
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _common  # noqa: E402


def _summary(system: str, results: list[dict], seconds: float, lease: float, p: float, pauses: float) -> dict:
    return {"system": system, "schedules": len(results), "writes_tried": sum(r["succeeded"] + r["failed"] for r in results),
            "succeeded": sum(r["succeeded"] for r in results), "taken_over": sum(r["failed"] for r in results),
            "samples_checked": sum(r["samples"] for r in results),
            "schedules_with_errors": sum(1 for r in results if r["errors"]), "lease_s": lease,
            "pause_probability": p, "longest_pause_s": pauses * lease, "seconds": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=3000)
    ap.add_argument("--server-schedules", type=int, default=20)
    args = ap.parse_args()
    from milvus_writers import FakeMilvus, run_schedule

    from twotower.retrieval.milvus.client import connect

    rows, errors = [], []
    with tempfile.TemporaryDirectory(prefix="milvus-writers-") as work:
        os.environ.update(TWOTOWER_MILVUS_LEASE_S="0.02", TWOTOWER_MILVUS_LOCK_SETTLE="0.002")
        t0 = time.perf_counter()

        def one(seed: int) -> dict:
            return run_schedule(FakeMilvus(), "fake", "c", Path(work) / f"s{seed}", seed, writers=2 + seed % 2,
                                lease=0.02, p=0.15, pauses=4)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(args.schedules)))
        rows.append(_summary("in memory (FakeMilvus)", results, time.perf_counter() - t0, 0.02, 0.15, 4))
        errors += [r["errors"][:2] for r in results if r["errors"]]
        print(rows[-1], flush=True)

        if args.server_schedules:
            os.environ.update(TWOTOWER_MILVUS_LEASE_S="0.3", TWOTOWER_MILVUS_LOCK_SETTLE="0.02")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", f"{work}/data",
                                     "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                    time.sleep(0.2)
                uri = f"http://127.0.0.1:{port}"
                client = connect(uri)
                t0 = time.perf_counter()
                results = [run_schedule(client, uri, f"c{seed}", Path(work) / f"m{seed}", seed, writers=2 + seed % 2,
                                        lease=0.3, p=0.1, pauses=3) for seed in range(args.server_schedules)]
                rows.append(_summary("milvus lite server", results, time.perf_counter() - t0, 0.3, 0.1, 3))
                errors += [r["errors"][:2] for r in results if r["errors"]]
                print(rows[-1], flush=True)
            finally:
                proc.terminate()
                proc.wait(30)
    _common.write_results("milvus_writers", rows, notes=NOTES, extra={"errors": errors[:20]})
    if errors:
        raise SystemExit(f"{len(errors)} schedules found a partial write or wrong statistics: {errors[:3]}")


NOTES = """\
Each schedule builds an index of 12 documents; 2 writers (even seeds) or 3 (odd seeds) each try an add of 3 new
documents, a replace of one of them and a remove of an original, in a random order; every step of every write
(`state.crash_point`: the lease, each batch, the flush, the lexicon, each consensus phase, the decision, the marks)
pauses with the given probability for a uniform time up to the longest pause. `taken_over`: writes that failed with
"another writer took over; nothing of this write is visible" (checked invisible). `samples_checked`: committed
states the reader checked while the writers ran (whole writes only; BM25 document count, total length and every
df recounted from the visible rows).
"""

if __name__ == "__main__":
    main()
