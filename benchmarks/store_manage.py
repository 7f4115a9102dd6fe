"""How long the store operations take on a local index (issue #53): count / list / get by a metadata filter and by a
``$text`` filter, a metadata update and a delete by filter, on generated documents (random unit vectors, no encoder:
the operations never encode).

    python benchmarks/store_manage.py --docs 100000

Each operation is timed once on a freshly opened index (first use: the metadata columns and the id order are built
then) and once more on the same opened index (warm); writes once each. Writes results/store_manage.json and .md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import write_results


WORDS = "tea green leaf cup water hot cold brew steam roast bean milk sugar sweet bitter".split()


def _build(root: Path, n: int, dim: int) -> None:
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.store import IndexSpec, IndexStore

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [" ".join(rng.choice(WORDS, size=12)) + (" rare phrase" if i % 1000 == 0 else "") for i in range(n)]
    metadata = [{"kind": ["tea", "coffee", "mate"][i % 3], "year": 1990 + i % 35, "tags": ["a", "b"][: i % 3]}
                for i in range(n)]
    docs = NewDocs([f"d{i:07d}" for i in range(n)], [""] * n, texts, vectors, metadata=metadata)
    IndexStore.build(root, docs, model={"name": "random"}, spec=IndexSpec(bm25=True), show_progress=False)


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args()
    import twotower as tt

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "index"
        build_s, _ = _timed(lambda: _build(root, args.docs, args.dim))
        reads = {
            "count kind=tea": lambda ix: ix.count({"kind": "tea"}),
            "count $not year<2000": lambda ix: ix.count({"$not": {"year": {"$lt": 2000}}}),
            "count $text rare (0.1%)": lambda ix: ix.count({"$text": {"$contains": "rare phrase"}}),
            "count $text common (~5%)": lambda ix: ix.count({"$text": {"$contains": "green tea"}}),
            "list first page of 100, kind=tea": lambda ix: len(ix.list({"kind": "tea"}, limit=100).ids),
            "list page 100 after a cursor": lambda ix: len(ix.list({"kind": "tea"}, limit=100, after="d0050000").ids),
            "get 100 by filter": lambda ix: len(ix.get(filter={"kind": "mate", "year": 2000}, limit=100)),
        }
        for name, op in reads.items():
            index = tt.Index.open(root)
            cold, result = _timed(lambda: op(index))
            warm, _ = _timed(lambda: op(index))
            rows.append({"system": name, "docs": args.docs, "result": result, "first_s": round(cold, 3),
                         "again_s": round(warm, 4)})
        index = tt.Index.open(root)
        sums = {n: i["sha256"] for n, i in index.info()["files"].items()}
        upd_s, updated = _timed(lambda: index.update(filter={"year": 2000}, metadata={"checked": True}))
        carried = sum(1 for n, i in index.info()["files"].items() if sums.get(n) == i["sha256"])
        rows.append({"system": "update metadata, year=2000", "docs": args.docs, "result": len(updated),
                     "first_s": round(upd_s, 3), "again_s": "", "files carried unchanged": carried})
        del_s, deleted = _timed(lambda: index.delete(filter={"checked": True}))
        rows.append({"system": "delete by filter, checked=true", "docs": args.docs, "result": len(deleted),
                     "first_s": round(del_s, 3), "again_s": ""})
    write_results("store_manage", rows, notes=f"Index built (random {args.dim}-d vectors, BM25) in {build_s:.1f} s. "
                  "first_s: the operation on a freshly opened index (building the metadata columns / id order "
                  "once); again_s: the same call again. Writes: one new version each (the delete rebuilds FAISS "
                  "and BM25; the update carries every file but docs.jsonl)." )


if __name__ == "__main__":
    main()
