"""Load and fault test of ``twotower serve`` on a SciFact index, loopback only, bounded in time.

1. ``search``: N concurrent clients send ``POST /search`` (SciFact test queries, k=10) for T seconds.
2. ``search+add``: the same while one writer adds documents (``POST /documents``), each add
   acknowledged only once its index version is durable; afterwards every acknowledged document
   must be readable.
3. ``kill-9``: the writer keeps adding; the server is killed with SIGKILL while an add is in flight,
   restarted on the same index, and every acknowledged document must be there.

Rows: ``phase``, ``clients``, ``requests``, ``errors``, ``req_per_s``, ``p50_ms``, ``p99_ms``,
``acked_adds``, ``lost_docs``. Errors and lost documents must be 0.

    python benchmarks/serve_load.py [--clients 4] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402

KEY = "serve-load-key-0123456789"  # the server wants at least 16 characters


def build_index(root: Path) -> Path:
    """A flat SciFact index from the cached all-MiniLM-L6-v2 vectors (encoded once, re-used)."""
    from twotower.data.beir import load_corpus
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.indexing import model_info
    from twotower.retrieval.store import IndexStore, NewDocs

    doc_ids, vectors, _, _ = scifact_vectors()
    corpus = load_corpus(DATA / "scifact" / "corpus.jsonl")
    docs = [corpus[d] for d in doc_ids]
    info = model_info(None, DualEncoder.load(None))
    IndexStore.build(root, NewDocs(doc_ids, [d.title for d in docs], [d.text for d in docs], vectors),
                     model=info, show_progress=False)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, index: Path, key_file: Path) -> None:
        self.index, self.key_file = index, key_file
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> float:
        import httpx

        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "twotower.cli", "serve", "--index", str(self.index), "--port", str(self.port),
             "--api-key-file", str(self.key_file)],
            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.base + "/healthz", timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def search_clients(base: str, queries: list[str], clients: int, seconds: float) -> dict:
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(i: int) -> None:
        rng = np.random.default_rng(i)
        with httpx.Client(base_url=base, timeout=30) as c:
            while time.perf_counter() < deadline:
                q = queries[int(rng.integers(len(queries)))]
                t0 = time.perf_counter()
                try:
                    r = c.post("/search", json={"query": q, "k": 10})
                    ok = r.status_code == 200 and len(r.json()["hits"]) == 10
                    detail = f"{r.status_code}"
                except httpx.HTTPError as exc:
                    ok, detail = False, repr(exc)
                dt = (time.perf_counter() - t0) * 1000
                with lock:
                    latencies.append(dt)
                    if not ok:
                        errors.append(detail)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.asarray(latencies)
    return {"clients": clients, "requests": len(lat), "errors": len(errors), "req_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "error_samples": errors[:3]}


class Writer(threading.Thread):
    """Adds one new document per request until stopped; remembers what the server acknowledged."""

    def __init__(self, base: str, prefix: str, max_adds: int = 10_000) -> None:
        super().__init__()
        self.base, self.prefix, self.max_adds = base, prefix, max_adds
        self.acked: list[str] = []
        self.in_flight = threading.Event()
        self.stop = threading.Event()
        self.failures: list[str] = []

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base, timeout=120, headers={"X-API-Key": KEY}) as c:
            for i in range(self.max_adds):
                if self.stop.is_set():
                    return
                doc_id = f"{self.prefix}-{i}"
                doc = {"_id": doc_id, "title": f"load test {i}", "text": f"A document added under load, number {i}."}
                self.in_flight.set()
                try:
                    r = c.post("/documents", json={"documents": [doc]})
                except httpx.HTTPError as exc:  # the server died mid-request: not acknowledged
                    self.failures.append(repr(exc))
                    return
                finally:
                    self.in_flight.clear()
                if r.status_code == 200:
                    self.acked.append(doc_id)
                else:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")


def lost(base: str, ids: list[str]) -> int:
    import httpx

    with httpx.Client(base_url=base, timeout=30) as c:
        return sum(c.get(f"/documents/{d}").status_code != 200 for d in ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--kill-after-adds", type=int, default=5, help="kill -9 once this many adds are acknowledged")
    args = parser.parse_args()

    from twotower.data.beir import load_queries

    queries = list(load_queries(DATA / "scifact" / "queries.jsonl").values())
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        index = build_index(tmp / "index")
        doc_ids_base = scifact_vectors()[0]
        print(f"index built in {time.perf_counter() - t0:.1f}s", flush=True)
        key_file = tmp / "key"
        key_file.write_text(KEY + "\n")
        server = Server(index, key_file)
        try:
            started = server.start()
            print(f"server up in {started:.1f}s on {server.base}", flush=True)
            search_clients(server.base, queries, 1, 2.0)  # warm-up
            r = search_clients(server.base, queries, args.clients, args.seconds)
            rows.append({"phase": "search", **r, "acked_adds": 0, "lost_docs": 0, "load_avg_1m": os.getloadavg()[0]})
            print(rows[-1], flush=True)

            writer = Writer(server.base, "under-load")
            writer.start()
            r = search_clients(server.base, queries, args.clients, args.seconds)
            writer.stop.set()
            writer.join()
            rows.append({"phase": "search+add", **r, "errors": r["errors"] + len(writer.failures),
                         "acked_adds": len(writer.acked), "lost_docs": lost(server.base, writer.acked),
                         "load_avg_1m": os.getloadavg()[0]})
            print(rows[-1], flush=True)
            before_kill = list(writer.acked)

            # kill -9 while an add is in flight, after some adds were acknowledged
            writer = Writer(server.base, "killed")
            writer.start()
            deadline = time.perf_counter() + 300
            while len(writer.acked) < args.kill_after_adds and time.perf_counter() < deadline and writer.is_alive():
                time.sleep(0.05)
            while not writer.in_flight.is_set() and writer.is_alive():
                time.sleep(0.001)
            time.sleep(0.05)  # into the add: encoding or writing the new version
            in_flight = writer.in_flight.is_set()
            server.kill9()
            writer.join()
            acked = before_kill + writer.acked
            restarted = server.start()
            with __import__("httpx").Client(base_url=server.base, timeout=30) as c:
                health = c.get("/healthz").json()
            rows.append({"phase": "kill-9 during add, restart", "clients": 1, "requests": len(writer.acked) + 1,
                         "errors": 0, "acked_adds": len(writer.acked), "lost_docs": lost(server.base, acked),
                         "restart_s": round(restarted, 1), "killed_mid_add": in_flight,
                         "documents_after": health["documents"], "documents_expected": len(doc_ids_base) + len(acked)})
            print(rows[-1], flush=True)
        finally:
            server.stop()
    for r in rows:
        r.pop("error_samples", None)
    notes = ("Loopback, one server process (`twotower serve`, all-MiniLM-L6-v2, flat index over the 5183 SciFact "
             "documents), clients are threads with one httpx connection each. `acked_adds`: adds answered 200 "
             "(durable); `lost_docs`: acknowledged documents not readable afterwards (after the restart for kill-9). "
             "The machine (2 cores) was shared with other jobs: see `load_avg_1m`.")
    write_results("serve_load", rows, notes=notes)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
