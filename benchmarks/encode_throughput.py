"""Encode the SciFact corpus with sentence-transformers' ``encode`` and with twotower, same model,
same max length, same batch size, in one run. Writes docs/s, tokens/s, the ratio to
sentence-transformers, the largest embedding difference and NDCG@10 on the test split.

    python benchmarks/encode_throughput.py [--limit N] [--batch-size 32] [--max-length 256]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import DATA, write_results
from twotower.data.beir import BeirDataset
from twotower.encoders.backbone import default_model_path
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.evaluation.metrics import evaluate
from twotower.retrieval.dense import exact_search, to_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    ap.add_argument("--limit", type=int, default=0, help="encode only the first N documents (0 = all)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args()

    ds = BeirDataset.load(args.data, "test")
    doc_ids = list(ds.corpus)[: args.limit or None]
    texts = [ds.corpus[d].full_text for d in doc_ids]
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    full_corpus = len(doc_ids) == len(ds.corpus)

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_path()), device="cpu")
    st.max_seq_length = args.max_length
    tok = st.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]
    n_tokens = sum(len(x) for x in tok)

    def st_encode(items):
        return st.encode(items, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True,
                         show_progress_bar=True)

    tt = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)
    systems = {
        "sentence-transformers fp32": (st_encode, st_encode),
    }
    for label, precision in (("twotower fp32", "fp32"), ("twotower default", "auto")):
        opts = EncodeOptions(batch_size=args.batch_size, precision=precision)
        systems[label] = (lambda items, o=opts: tt.encode_documents(items, o), lambda items, o=opts: tt.encode_queries(items, o))

    rows, ref = [], None
    for label, (enc_docs, enc_queries) in systems.items():
        t0 = time.perf_counter()
        d = enc_docs(texts)
        wall = time.perf_counter() - t0
        row = {"system": label, "docs": len(texts), "wall_s": round(wall, 2), "docs_per_s": len(texts) / wall,
               "tokens_per_s": n_tokens / wall}
        if ref is None:
            ref = d
        else:
            row["ratio_vs_st"] = (len(texts) / wall) / rows[0]["docs_per_s"]
            row["max_abs_diff"] = float(np.abs(d - ref).max())
            row["min_cosine"] = float((d * ref).sum(1).min())
        if full_corpus:
            s, i = exact_search(enc_queries(queries), d, 1000)
            m = evaluate(ds.qrels, to_run(qids, doc_ids, s, i), ("ndcg@10", "recall@100"))
            row.update(m)
        rows.append(row)
        print(row, flush=True)
    write_results("encode_throughput", rows, notes=(
        f"all-MiniLM-L6-v2, max length {args.max_length}, batch {args.batch_size}, {len(texts)} SciFact documents "
        f"({n_tokens} tokens), torch threads {torch.get_num_threads()}. 'twotower default' is precision=auto "
        "(bf16 where the CPU has AMX/AVX512-BF16). max_abs_diff/min_cosine compare each embedding with "
        "sentence-transformers'."))


if __name__ == "__main__":
    main()
