"""Cached SciFact vectors of the default model (all-MiniLM-L6-v2), shared by the benchmarks.

The corpus takes minutes to encode on 2 CPU cores, so the vectors are kept in the ignored
``.cache/vectors/scifact-minilm/`` folder (``docs.npy``, ``queries.npy``, ``doc_ids.json``,
``query_ids.json``) and re-used by every benchmark. Delete the folder to re-encode.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from _common import DATA

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "vectors" / "scifact-minilm"


def scifact_vectors(precision: str = "auto") -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """``(doc_ids, doc_vecs, query_ids, query_vecs)`` for every SciFact document and query.

    The cache records the resolved precision and twotower's version (``meta.json``): vectors from
    another precision or version (e.g. copied from a bf16 machine) are re-encoded."""
    import torch

    import twotower
    from twotower.encoders.inference import resolve_precision

    meta = {"precision": resolve_precision(precision, torch.device("cpu")), "twotower": twotower.__version__}
    names = ("docs.npy", "queries.npy", "doc_ids.json", "query_ids.json", "meta.json")
    if all((CACHE / n).is_file() for n in names) and json.loads((CACHE / "meta.json").read_text()) == meta:
        return (json.loads((CACHE / "doc_ids.json").read_text()), np.load(CACHE / "docs.npy"),
                json.loads((CACHE / "query_ids.json").read_text()), np.load(CACHE / "queries.npy"))
    from twotower.data.beir import load_corpus, load_queries
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.io import atomic_write_bytes, atomic_write_json
    import io

    corpus = load_corpus(DATA / "scifact" / "corpus.jsonl")
    queries = load_queries(DATA / "scifact" / "queries.jsonl")
    model = DualEncoder.load(None)
    opts = EncodeOptions(precision=meta["precision"])  # pinned: auto would encode a big corpus in int8 on VNNI
    doc_ids, qids = list(corpus), list(queries)
    docs = model.encode_documents([corpus[d].full_text for d in doc_ids], opts)
    qv = model.encode_queries([queries[q] for q in qids], opts)
    CACHE.mkdir(parents=True, exist_ok=True)
    for stale in CACHE.glob("tokens*.npy"):  # multivector_scifact.py's token vectors belong to the old encoding
        stale.unlink()
    for name, arr in (("docs.npy", docs), ("queries.npy", qv)):
        buf = io.BytesIO()
        np.save(buf, arr)
        atomic_write_bytes(CACHE / name, buf.getvalue())
    atomic_write_json(CACHE / "doc_ids.json", doc_ids)
    atomic_write_json(CACHE / "query_ids.json", qids)
    atomic_write_json(CACHE / "meta.json", meta)
    return doc_ids, docs, qids, qv


if __name__ == "__main__":
    d, dv, q, qv = scifact_vectors()
    print(len(d), dv.shape, len(q), qv.shape)
