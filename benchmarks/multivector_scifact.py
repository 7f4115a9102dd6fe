"""ME-BERT multi-vector documents on SciFact test: m = 1, 4, 8 first token vectors per document.

    python benchmarks/multivector_scifact.py

Zero-shot: the default all-MiniLM-L6-v2 (mean-pooled, never trained with the max score), token
vectors L2-normalised, queries = the model's pooled query vector. Each m is written as a
``twotower.retrieval.store`` index (flat FAISS over all entries; hits reduced to documents and
re-scored exactly) and searched through it. The mean-pooled single-vector model is the reference row.
Token vectors (m=8) are cached in .cache/vectors/scifact-minilm/tokens8.npy.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from _common import DATA, write_results  # noqa: E402
from _vectors import CACHE, scifact_vectors  # noqa: E402

M_MAX = 8


def token_vectors(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    vec_path, off_path = CACHE / f"tokens{M_MAX}.npy", CACHE / f"tokens{M_MAX}.offsets.npy"
    if vec_path.is_file() and off_path.is_file():
        return np.load(vec_path), np.load(off_path)
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.multivector import encode_multivector

    model = DualEncoder.load(None)
    vecs, offsets = encode_multivector(model.doc_tower, texts, M_MAX, max_length=model.doc_max_length)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(off_path, offsets)
    np.save(vec_path, vecs)
    return vecs, offsets


def first_m(vecs: np.ndarray, offsets: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.minimum(np.diff(offsets), m)
    keep = np.concatenate([np.arange(offsets[i], offsets[i] + counts[i]) for i in range(len(counts))])
    return vecs[keep], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def main() -> None:
    from twotower.data.beir import load_corpus, load_qrels
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import to_run
    from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

    root = DATA / "scifact"
    corpus = load_corpus(root / "corpus.jsonl")
    qrels = load_qrels(root / "qrels" / "test.tsv")
    doc_ids, doc_vecs, qids, q_vecs = scifact_vectors()
    test = [q for q in qids if q in qrels]
    qv = q_vecs[[qids.index(q) for q in test]]
    tv, toff = token_vectors([corpus[d].full_text for d in doc_ids])

    def measure(system: str, docs: NewDocs, multivector: int | None) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            store = IndexStore.build(Path(tmp) / "idx", docs, model={"name": "all-MiniLM-L6-v2"},
                                     spec=IndexSpec(kind="flat"), multivector=multivector, show_progress=False)
            t0 = time.perf_counter()
            scores, rows = store.search(qv, 100)
            batch_s = time.perf_counter() - t0
            times = []
            for i in range(len(qv)):
                t0 = time.perf_counter()
                store.search(qv[i : i + 1], 100)
                times.append((time.perf_counter() - t0) * 1000)
            index_bytes = (store.dir / "vectors.npy").stat().st_size + (store.dir / "faiss.index").stat().st_size
            n_vec = store.manifest["num_vectors"]
            store.close()
        m = evaluate(qrels, to_run(test, doc_ids, scores, rows), ("ndcg@10", "recall@100"))
        return {"system": system, **{k: round(v, 4) for k, v in m.items()}, "vectors": n_vec,
                "index_bytes": index_bytes, "p50_ms": round(float(np.median(times)), 3),
                "queries_per_s": round(len(qv) / batch_s, 1)}

    rows = [measure("mean-pooled (1 vector)", NewDocs(doc_ids, doc_ids, doc_ids, doc_vecs), None)]
    for m in (1, 4, 8):
        v, off = first_m(tv, toff, m)
        rows.append(measure(f"m={m}", NewDocs(doc_ids, doc_ids, doc_ids, v, off), m))
        print(rows[-1], flush=True)
    notes = (
        "SciFact test, 300 queries. ME-BERT zero-shot: document = first m token vectors ([CLS] first) of "
        "all-MiniLM-L6-v2's last layer (max length 256), L2-normalised; query = the model's mean-pooled vector; "
        "score = max over the m inner products. Flat FAISS over all entries, top k·m entries reduced to documents and "
        "re-scored exactly (twotower.retrieval.store). index_bytes = vectors.npy + faiss.index. p50_ms: batch-1 "
        "search of the top 100 (query encoding excluded). The model was never trained with the max score, so these "
        "rows measure the untrained representation; ME-BERT's max-score fine-tuning is not implemented yet."
    )
    write_results("multivector_scifact", rows, notes=notes)


if __name__ == "__main__":
    main()
