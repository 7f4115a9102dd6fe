"""int8 vectors on Milvus against the local int8 index on SciFact test (issue #54).

The default model (all-MiniLM-L6-v2, fp32, documents cut at 128 tokens as in ``compression_scifact.py``) encodes
SciFact once (cached in ``/tmp/twotower-scifact-minilm-128.npz``); the same vectors then go into the local index
(fp32 Flat, int8 SQ8) and into Milvus Lite (fp32 FLAT; int8: IVF_SQ8 with one list, what ``--vectors int8`` builds for
``--kind flat``, and HNSW_SQ for ``--kind hnsw``). NDCG@10 and recall@100 over the 300 test queries;
``top10_vs_fp32``: the share of each query's local fp32 top 10 found in the row's top 10.

    python benchmarks/milvus_int8_scifact.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import _common  # noqa: E402

CACHE = Path("/tmp/twotower-scifact-minilm-128.npz")


def vectors(ds, ids, qids):
    if CACHE.is_file():
        z = np.load(CACHE)
        return z["docs"], z["queries"]
    from twotower.encoders.layout import default_model_path
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    enc = DualEncoder.load(str(default_model_path()), doc_max_length=128, query_max_length=64)
    docs = enc.encode_documents([ds.corpus[d].full_text for d in ids], EncodeOptions(precision="fp32"))
    qv = enc.encode_queries([ds.queries[q] if isinstance(ds.queries[q], str) else ds.queries[q].text for q in qids],
                            EncodeOptions(precision="fp32", show_progress=False))
    np.savez(CACHE, docs=docs, queries=qv)
    return docs, qv


def scored(name: str, store, ds, qids: list, qv, kwargs: dict, ref: dict | None) -> tuple[dict, dict]:
    """The row of ``store`` searched with ``qv`` (top 100, ``kwargs``): NDCG@10, recall@100 and the share of the
    reference run's top 10 (``ref``, per query; None: this run is the reference), and the reference."""
    from twotower.evaluation.metrics import evaluate

    scores, found = store.search(qv, 100, **kwargs)
    run = {q: {store.doc_ids[r]: float(s) for s, r in zip(sc, fd) if r >= 0} for q, sc, fd in zip(qids, scores, found)}
    top = {q: set(sorted(run[q], key=lambda d: -run[q][d])[:10]) for q in qids}
    ref = ref or top
    m = evaluate(ds.qrels, run, ["ndcg@10", "recall@100"])
    return ({"system": name, "ndcg@10": round(m["ndcg@10"], 4), "recall@100": round(m["recall@100"], 4),
             "top10_vs_fp32": round(float(np.mean([len(top[q] & ref[q]) / 10 for q in qids])), 4)}, ref)


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
    rows, ref = [], None
    with tempfile.TemporaryDirectory(prefix="milvus-int8-") as work:
        work = Path(work)
        uri = str(work / "m.db")
        systems = [("local fp32 Flat", lambda: IndexStore.build(work / "l32", new, model={"name": "minilm"},
                                                               spec=IndexSpec(), show_progress=False), {}),
                   ("local int8 SQ8", lambda: IndexStore.build(work / "l8", new, model={"name": "minilm"},
                                                              spec=IndexSpec(vectors="int8"), show_progress=False), {}),
                   ("milvus fp32 FLAT", lambda: MilvusStore.build(work / "m32", new, model={"name": "minilm"},
                                                                  spec=IndexSpec(), uri=uri, collection="f32",
                                                                  show_progress=False), {}),
                   ("milvus int8 IVF_SQ8 (flat)", lambda: MilvusStore.build(
                       work / "m8", new, model={"name": "minilm"}, spec=IndexSpec(vectors="int8"), uri=uri,
                       collection="i8", show_progress=False), {}),
                   ("milvus int8 HNSW_SQ (hnsw, ef 256)", lambda: MilvusStore.build(
                       work / "m8h", new, model={"name": "minilm"}, spec=IndexSpec(kind="hnsw", vectors="int8"),
                       uri=uri, collection="i8h", show_progress=False), {"ef_search": 256})]
        for name, make, kwargs in systems:
            row, ref = scored(name, make(), ds, qids, qv, kwargs, ref)
            rows.append(row)
            print(rows[-1], flush=True)
        forget_client(uri)
    _common.write_results("milvus_int8_scifact", rows, notes=NOTES)


NOTES = """\
The same fp32 vectors everywhere (all-MiniLM-L6-v2, documents cut at 128 tokens). Local int8 is FAISS SQ8 (8 bits
per dimension, trained ranges); Milvus int8 is Milvus' IVF_SQ8 (one list: an exhaustive scan of the codes) or
HNSW_SQ, both FAISS scalar quantizers inside Milvus Lite. Milvus keeps the fp32 field beside the index.
"""

if __name__ == "__main__":
    main()
