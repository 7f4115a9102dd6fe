"""Binary vectors on a Milvus server against the local binary index on SciFact test (issue #54).

The same vectors as ``milvus_int8_scifact.py`` (all-MiniLM-L6-v2, fp32, documents cut at 128 tokens; cached in
``/tmp/twotower-scifact-minilm-128.npz``) go into the local index (fp32 Flat; binary: FAISS BFlat, 4 × k Hamming
candidates rescored from int8 codes, the default) and into a Milvus server (PyPI's standalone Milvus 2.3.5, started
here: ``tests/milvus_server.py``; Milvus Lite has no binary field): ``--vectors binary`` as BIN_FLAT and as
BIN_IVF_FLAT (the calibrated default nprobe, 1, 32, and every list), rescored from int8 codes, and with ``rescore="none"`` (Hamming
only). NDCG@10 and recall@100 over the 300 test queries; ``top10_vs_fp32``: the share of each query's local fp32
top 10 found in the row's top 10; ``bytes_per_doc``: what each stores per document for its vectors.

    python benchmarks/milvus_binary_scifact.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


import _common  # noqa: E402
from milvus_int8_scifact import scored, vectors  # noqa: E402
from milvus_server import milvus_server  # noqa: E402


def main() -> None:
    import twotower as tt
    from twotower.retrieval.index.kinds import IndexSpec
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus.store import MilvusStore, forget_client
    from twotower.retrieval.store import IndexStore

    ds = tt.load_beir(_common.DATA / "scifact")
    ids, qids = list(ds.corpus), list(ds.queries)
    docs, qv = vectors(ds, ids, qids)
    new = NewDocs(ids, [ds.corpus[d].title for d in ids], [ds.corpus[d].text for d in ids], docs)
    dim = docs.shape[1]
    rows, ref = [], None
    with tempfile.TemporaryDirectory(prefix="milvus-binary-") as work, milvus_server(Path(work) / "server") as server:
        work = Path(work)
        uri = server.uri

        def milvus(name, spec):
            return lambda: MilvusStore.build(work / name, new, model={"name": "minilm"}, spec=spec, uri=uri,
                                             collection=name, show_progress=False)

        systems = [
            ("local fp32 Flat", lambda: IndexStore.build(work / "l32", new, model={"name": "minilm"},
                                                         spec=IndexSpec(), show_progress=False), {}, 4 * dim),
            ("local binary BFlat, int8 rescore", lambda: IndexStore.build(
                work / "lb", new, model={"name": "minilm"}, spec=IndexSpec(vectors="binary"), show_progress=False),
             {}, dim // 8 + dim),
            ("milvus binary BIN_FLAT, int8 rescore", milvus("bflat", IndexSpec(vectors="binary")), {}, dim // 8 + dim),
            ("milvus binary BIN_IVF_FLAT, int8 rescore", milvus("bivf", IndexSpec(kind="ivf", vectors="binary")), {},
             dim // 8 + dim),
            ("milvus binary BIN_IVF_FLAT, int8 rescore (nprobe 1)", None, {"nprobe": 1}, dim // 8 + dim),
            ("milvus binary BIN_IVF_FLAT, int8 rescore (nprobe 32)", None, {"nprobe": 32}, dim // 8 + dim),
            ("milvus binary BIN_IVF_FLAT, int8 rescore (every list)", None, "all", dim // 8 + dim),
            ("local binary BFlat, no rescore", lambda: IndexStore.build(
                work / "lbn", new, model={"name": "minilm"}, spec=IndexSpec(vectors="binary", rescore="none"),
                show_progress=False), {}, dim // 8),
            ("milvus binary BIN_FLAT, no rescore", milvus("bnone", IndexSpec(vectors="binary", rescore="none")), {},
             dim // 8),
        ]
        store = None
        for name, make, kwargs, size in systems:
            if make is not None:
                store = make()
            if kwargs == "all":
                kwargs = {"nprobe": store.manifest["milvus"]["index_params"]["nlist"]}
            row, ref = scored(name, store, ds, qids, qv, kwargs, ref)
            rows.append(dict(row, bytes_per_doc=size))
            if "IVF" in name and not kwargs:  # the calibrated default (milvus.breadth)
                rows[-1]["system"] += f" (calibrated nprobe {store.manifest['milvus']['search']['nprobe']})"
            print(rows[-1], flush=True)
        forget_client(uri)
    local = {r["system"]: r["ndcg@10"] for r in rows}
    gap = abs(local["milvus binary BIN_FLAT, int8 rescore"] - local["local binary BFlat, int8 rescore"])
    _common.write_results("milvus_binary_scifact", rows, notes=NOTES + f"\nBIN_FLAT vs local binary: NDCG@10 gap {gap:.4f}.\n")


NOTES = """\
The same fp32 vectors everywhere (all-MiniLM-L6-v2, documents cut at 128 tokens). Binary: the sign bits (48 bytes at
384 dimensions) searched by Hamming distance for 4 × k candidates, rescored with the float query against int8 codes
(384 bytes, by the corpus's per-dimension ranges): FAISS on the local index, Milvus' BIN_FLAT / BIN_IVF_FLAT with
the codes in a VARCHAR field read back with the hits on Milvus. Server: PyPI milvus 2.3.5 (standalone, started
offline), pymilvus 3.0.2; no BM25 part (Milvus 2.3 has no sparse vectors).
"""

if __name__ == "__main__":
    main()
