"""ME-BERT multi-vector documents on SciFact test: m = 1, 4, 8 first token vectors per document.

    python benchmarks/multivector_scifact.py [--train-epochs E] [--batch-size 32] [--lr 2e-5]

Zero-shot rows ``m=1``, ``m=4``, ``m=8``: the default all-MiniLM-L6-v2 (mean-pooled, never trained
with the max score), token vectors L2-normalised, queries = the model's pooled query vector. With
``--train-epochs E`` each m also gets a row ``m=M trained``: the default model fine-tuned for E epochs
on SciFact train with the ME-BERT objective (max score over the first m token vectors, in-batch
softmax; ``twotower.training.multivector``, as ``twotower train --multivector M``), then evaluated the
same way. Each m is written as a ``twotower.retrieval.store`` index (flat FAISS over all entries; hits
reduced to documents and re-scored exactly) and searched through it. The mean-pooled single-vector
model is the reference row. Token vectors (m=8) are cached in .cache/vectors/scifact-minilm/tokens8.npy.

``--limit N`` is a smoke test: the first N test queries, their judged documents plus the first N
corpus documents, the first N train pairs; nothing is cached and no result file is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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


def _subset(corpus: dict, qrels: dict, train_pairs: list, limit: int) -> tuple[list[str], list[str], list]:
    """(doc ids, test query ids, train pairs) of the --limit smoke subset."""
    test = [q for q in qrels][:limit]
    judged = [d for q in test for d in qrels[q] if d in corpus]
    doc_ids = list(dict.fromkeys(judged + list(corpus)[:limit]))
    return doc_ids, test, train_pairs[:limit]


def train_multivector(m: int, args: argparse.Namespace, work: Path, pairs: Path | None) -> tuple[Path, float]:
    """Fine-tune the default model with the max score over m token vectors; (model dir, seconds)."""
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    stage = StageConfig(name="finetune", data=None if pairs else args.data, pairs=str(pairs) if pairs else None,
                        split="train", epochs=args.train_epochs, steps=args.train_steps, batch_size=args.batch_size,
                        lr=args.lr, warmup=0.1, temperature=args.temperature)
    cfg = TrainConfig(out=str(work / f"m{m}"), multivector=m, doc_max_length=args.max_length,
                      query_max_length=args.max_length, checkpoint_every=10_000, stages=[stage])
    t0 = time.perf_counter()
    Trainer(cfg).train()
    return work / f"m{m}" / "model", time.perf_counter() - t0


def main() -> None:
    from twotower.data.beir import BeirDataset, load_corpus, load_qrels, load_queries
    from twotower.data.pairs import pairs_from_beir, save_pairs
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import to_run
    from twotower.retrieval.multivector import encode_multivector
    from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--train-epochs", type=float, default=None,
                    help="also fine-tune the default model with the max score for each m (rows 'm=M trained')")
    ap.add_argument("--train-steps", type=int, default=None, help="training steps instead of epochs (smoke tests)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--max-length", type=int, default=256, help="query and document max tokens when training")
    ap.add_argument("--limit", type=int, default=None, help="smoke test on a small subset (writes no results)")
    ap.add_argument("--work", default=None, help="folder for the trained models (default: a temp folder)")
    args = ap.parse_args()
    if args.train_steps and args.train_epochs is None:
        ap.error("--train-steps needs --train-epochs (the training mode)")

    root = Path(args.data)
    corpus = load_corpus(root / "corpus.jsonl")
    queries = load_queries(root / "queries.jsonl")
    qrels = load_qrels(root / "qrels" / "test.tsv")
    pairs_path = None
    if args.limit:
        all_pairs = pairs_from_beir(BeirDataset.load(root, "train"))
        doc_ids, test, train_pairs = _subset(corpus, qrels, all_pairs, args.limit)
        qrels = {q: qrels[q] for q in test}
        base = DualEncoder.load(None)
        opts = EncodeOptions(show_progress=False)
        doc_vecs = base.encode_documents([corpus[d].full_text for d in doc_ids], opts)
        qv = base.encode_queries([queries[q] for q in test], opts)
        tv, toff = encode_multivector(base.doc_tower, [corpus[d].full_text for d in doc_ids], M_MAX,
                                      max_length=base.doc_max_length, show_progress=False)
    else:
        doc_ids, doc_vecs, qids, q_vecs = scifact_vectors()
        test = [q for q in qids if q in qrels]
        qv = q_vecs[[qids.index(q) for q in test]]
        tv, toff = token_vectors([corpus[d].full_text for d in doc_ids])

    def measure(system: str, docs: NewDocs, multivector: int | None, qv: np.ndarray) -> dict:
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

    rows = [measure("mean-pooled (1 vector)", NewDocs(doc_ids, doc_ids, doc_ids, doc_vecs), None, qv)]
    for m in (1, 4, 8):
        v, off = first_m(tv, toff, m)
        rows.append(measure(f"m={m}", NewDocs(doc_ids, doc_ids, doc_ids, v, off), m, qv))
        print(rows[-1], flush=True)
    if args.train_epochs is not None:
        work = Path(args.work or tempfile.mkdtemp(prefix="multivector-"))
        if args.limit:
            pairs_path = work / "train-pairs.jsonl"
            work.mkdir(parents=True, exist_ok=True)
            save_pairs(train_pairs, pairs_path)
        for m in (1, 4, 8):
            model_dir, train_s = train_multivector(m, args, work, pairs_path)
            model = DualEncoder.load(model_dir)
            v, off = encode_multivector(model.doc_tower, [corpus[d].full_text for d in doc_ids], model.multivector,
                                        max_length=model.doc_max_length, show_progress=not args.limit)
            q_trained = model.encode_queries([queries[q] for q in test], EncodeOptions(show_progress=False))
            rows.append({**measure(f"m={m} trained", NewDocs(doc_ids, doc_ids, doc_ids, v, off), m, q_trained),
                         "train_s": round(train_s, 1)})
            print(rows[-1], flush=True)
    if args.limit:
        print(f"smoke test on {len(test)} queries / {len(doc_ids)} documents: no result file written")
        return
    trained = ""
    if args.train_epochs is not None:
        trained = (
            f" Rows 'm=M trained': all-MiniLM-L6-v2 fine-tuned on SciFact train (judged pairs) for "
            f"{args.train_epochs:g} epoch(s) with the ME-BERT objective (max score over the first M token vectors, "
            f"in-batch bi-directional softmax, temperature {args.temperature}, batch {args.batch_size}, lr {args.lr}, "
            f"max length {args.max_length}; twotower train --multivector M), its own query vectors; train_s = "
            "training wall time."
        )
    notes = (
        "SciFact test, 300 queries. ME-BERT zero-shot: document = first m token vectors ([CLS] first) of "
        "all-MiniLM-L6-v2's last layer (max length 256), L2-normalised; query = the model's mean-pooled vector; "
        "score = max over the m inner products. Flat FAISS over all entries, top k·m entries reduced to documents and "
        "re-scored exactly (twotower.retrieval.store). index_bytes = vectors.npy + faiss.index. p50_ms: batch-1 "
        "search of the top 100 (query encoding excluded). The zero-shot model was never trained with the max score, "
        "so those rows measure the untrained representation." + trained
    )
    write_results("multivector_scifact", rows, notes=notes)


if __name__ == "__main__":
    main()
