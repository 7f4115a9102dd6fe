"""Ray encoding of the SciFact corpus vs single-process encoding: same vectors, same metrics.

Encodes the 5183 SciFact documents with all-MiniLM-L6-v2 on a local Ray instance (``--workers``
actors, one CPU each) through :func:`twotower.scale.ray_encode.encode_corpus_ray`, and compares the
vectors with single-process ``DualEncoder.encode_documents`` run in the same script (same precision
``auto`` and batch size 32): max |difference|, and NDCG@10 / Recall@100 on the test queries with
each (queries: the cached vectors of ``benchmarks/_vectors.py``, whose document vectors are shown
too; they were made by an earlier version of the encoder).

    python benchmarks/ray_scifact.py [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA, write_results  # noqa: E402
from _vectors import scifact_vectors  # noqa: E402


def metrics(doc_ids, docs, qids, queries, qrels) -> dict:
    from twotower.evaluation.metrics import evaluate

    keep = [i for i, q in enumerate(qids) if q in qrels]
    scores = queries[keep] @ docs.T
    top = np.argsort(-scores, axis=1)[:, :100]
    run = {qids[i]: {doc_ids[j]: float(scores[r, j]) for j in top[r]} for r, i in enumerate(keep)}
    m = evaluate(qrels, run, ("ndcg@10", "recall@100"))
    return {k: round(v, 4) for k, v in m.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    import ray

    from twotower.data.beir import load_corpus, load_qrels
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.scale.ray_encode import RayConfig, encode_corpus_ray

    doc_ids, single, qids, queries = scifact_vectors()
    corpus = load_corpus(DATA / "scifact" / "corpus.jsonl")
    qrels = load_qrels(DATA / "scifact" / "qrels" / "test.tsv")
    enc = DualEncoder.load(None)
    texts = [corpus[d].full_text for d in doc_ids]
    t0 = time.perf_counter()
    now = enc.encode_documents(texts, EncodeOptions(batch_size=32, precision="auto", show_progress=False))
    single_s = time.perf_counter() - t0
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        dist = encode_corpus_ray(doc_ids, texts, model=None, tokenizer=enc.doc_tower.tokenizer,
                                 max_length=enc.doc_max_length, batch_size=32, precision="auto",
                                 shard_dir=Path(tmp) / "shards", cfg=RayConfig(workers=args.workers),
                                 show_progress=False)
        wall = time.perf_counter() - t0
    ray.shutdown()
    rows = [
        {"system": "single process", **metrics(doc_ids, now, qids, queries, qrels), "max_abs_diff": 0.0,
         "wall_s": round(single_s, 1)},
        {"system": f"Ray, {args.workers} actors (1 CPU each)", **metrics(doc_ids, dist, qids, queries, qrels),
         "max_abs_diff": float(np.abs(dist - now).max()), "wall_s": round(wall, 1)},
        {"system": "cached vectors (benchmarks/_vectors.py)", **metrics(doc_ids, single, qids, queries, qrels),
         "max_abs_diff": float(np.abs(single - now).max())},
    ]
    write_results("ray_scifact", rows, notes="all-MiniLM-L6-v2, precision auto (bf16 on this CPU), batch 32, max length "
                  "256; `max_abs_diff`: largest |difference| to the single-process vectors over all 5183 × 384 entries. The machine was shared with other jobs: "
                  "wall time is not a throughput measurement.")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
