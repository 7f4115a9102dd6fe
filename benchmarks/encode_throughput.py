"""Encode the SciFact corpus with sentence-transformers' ``encode`` and with twotower, same model,
same max length, same batch size, in one run. The systems take turns on 256-document slices
(order alternating) so that background load falls on all of them alike. Writes docs/s,
tokens/s, the ratio to sentence-transformers, the largest embedding difference and NDCG@10.

    python benchmarks/encode_throughput.py [--limit N] [--batch-size 32] [--max-length 256]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import (encoding_parser, interleaved, load_average, st_encoder, test_documents, vector_metrics,
                     write_results)
from twotower.encoders.towers import DualEncoder, EncodeOptions


def main() -> None:
    args = encoding_parser(__doc__).parse_args()
    ds, doc_ids, texts = test_documents(args)
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    st, st_encode = st_encoder(args)
    n_tokens = sum(len(x) for x in st.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"])
    tt = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)

    def tt_system(precision):
        opts = EncodeOptions(batch_size=args.batch_size, precision=precision, show_progress=False)
        return (lambda items: tt.encode_documents(items, opts)), (lambda items: tt.encode_queries(items, opts))

    fp32_docs, fp32_queries = tt_system("fp32")
    fast_docs, fast_queries = tt_system("auto")
    query_fns = {"sentence-transformers fp32": st_encode, "twotower fp32": fp32_queries, "twotower default": fast_queries}
    load_before = load_average()
    out = interleaved({"sentence-transformers fp32": st_encode, "twotower fp32": fp32_docs, "twotower default": fast_docs},
                      texts)
    ref = out["sentence-transformers fp32"][0]
    rows = []
    for name, (emb, secs) in out.items():
        row = {"system": name, "docs": len(texts), "wall_s": round(secs, 2), "docs_per_s": len(texts) / secs,
               "tokens_per_s": n_tokens / secs}
        row["ratio_vs_st"] = out["sentence-transformers fp32"][1] / secs
        row["max_abs_diff"] = float(np.abs(emb - ref).max())
        row["min_cosine"] = float((emb * ref).sum(1).min())
        if len(doc_ids) == len(ds.corpus):
            row.update(vector_metrics(ds.qrels, qids, query_fns[name](queries), doc_ids, emb))
        rows.append(row)
        print(row, flush=True)
    write_results("encode_throughput", rows, notes=(
        f"all-MiniLM-L6-v2, max length {args.max_length}, batch {args.batch_size}, {len(texts)} SciFact documents "
        f"({n_tokens} tokens), torch threads {torch.get_num_threads()}, load average {load_before:.1f} before / "
        f"{load_average():.1f} after. Systems take turns on 256-document slices (alternating order). "
        "'twotower default' is precision=auto (bf16 weights where the CPU has AMX/AVX512-BF16). "
        "max_abs_diff/min_cosine compare each embedding with sentence-transformers'."))


if __name__ == "__main__":
    main()
