"""Milvus-side work of writes and reads against the local backend's (issue #54): every per-document round trip is
batched (duplicate checks, ``documents()``, the rows a remove or replace reads, the documents of search hits).

Both backends hold the same index: SciFact's 5,183 documents with BM25, random 384-d vectors (encoding is the same
for both and left out). Timed, each on its own copy: the duplicate check of 1,000 and 10,000 new ids plus the add
itself (``store.existing`` + ``store.add`` on Milvus, ``row_of`` + ``store.add`` locally), ``documents()`` of 5,000
ids (``tt.Index.documents``'s path: ``store.documents``), and a remove of 1,000. Milvus: Milvus Lite, embedded (a
``.db`` folder).

    python benchmarks/milvus_batch.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import _common  # noqa: E402


def main() -> None:
    import twotower as tt
    from twotower.retrieval.index.kinds import IndexSpec
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus.store import MilvusStore, forget_client
    from twotower.retrieval.store import IndexStore

    ds = tt.load_beir(_common.DATA / "scifact")
    ids = list(ds.corpus)
    titles = [ds.corpus[d].title for d in ids]
    bodies = [ds.corpus[d].text for d in ids]
    rng = np.random.default_rng(0)

    def vectors(n: int) -> np.ndarray:
        v = rng.standard_normal((n, 384)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def new_docs(n: int, tag: str) -> NewDocs:
        pick = [i % len(ids) for i in range(n)]
        return NewDocs([f"{tag}{i}" for i in range(n)], [titles[i] for i in pick], [bodies[i] for i in pick],
                       vectors(n))

    base = NewDocs(ids, titles, bodies, vectors(len(ids)))
    spec, model = IndexSpec(bm25=True), {"name": "random-384d"}
    rows = []
    load_start = _common.load_average()
    with tempfile.TemporaryDirectory(prefix="milvus-batch-") as work:
        work = Path(work)
        stores = {}
        t0 = time.perf_counter()
        IndexStore.build(work / "local", base, model=model, spec=spec, show_progress=False)
        build = {"local": time.perf_counter() - t0}
        t0 = time.perf_counter()
        MilvusStore.build(work / "milvus", base, model=model, spec=spec, uri=str(work / "m.db"), collection="batch",
                          show_progress=False)
        build["milvus"] = time.perf_counter() - t0
        stores = {"local": lambda: IndexStore.open(work / "local"), "milvus": lambda: MilvusStore.open(work / "milvus")}

        def timed(name: str, fn) -> None:
            row = {"operation": name}
            for backend, opener in stores.items():
                store = opener()
                t0 = time.perf_counter()
                fn(store, backend)
                row[f"{backend}_s"] = round(time.perf_counter() - t0, 3)
            row["milvus_over_local"] = round(row["milvus_s"] / row["local_s"], 2)
            rows.append(row)
            print(row, flush=True)

        def add(n: int, tag: str):
            docs = new_docs(n, tag)

            def run(store, backend):
                if backend == "milvus":
                    assert not store.existing(docs.ids)
                else:
                    assert not [d for d in docs.ids if d in store.row_of]
                store.add(docs, show_progress=False)
            return run

        rows.append({"operation": "build 5,183 (for reference)", "local_s": round(build["local"], 3),
                     "milvus_s": round(build["milvus"], 3),
                     "milvus_over_local": round(build["milvus"] / build["local"], 2)})
        timed("add 1,000 (duplicate check + write)", add(1_000, "a"))
        timed("add 10,000 (duplicate check + write)", add(10_000, "b"))
        sample = list(rng.choice(ids, size=5_000, replace=False))
        timed("documents() of 5,000", lambda store, _: store.documents(sample))
        timed("remove 1,000", lambda store, _: store.remove(sample[:1_000], show_progress=False))
        forget_client(str(work / "m.db"))
        shutil.rmtree(work, ignore_errors=True)
    _common.write_results("milvus_batch", rows, notes=NOTES,
                          extra={"load_average_1m": {"start": load_start, "end": _common.load_average()}})


NOTES = """\
Seconds of one run each, on 2 shared cores (the load average is in the JSON). The local backend writes a new version
folder (vectors, ids, BM25 index); Milvus upserts the rows in batches of 256, keeps the BM25 statistics' delta in the
state collection and decides the write by consensus on state rows. Ids go to Milvus 256 per query (`id in [...]`
expressions).
"""

if __name__ == "__main__":
    main()
