"""Encoding and search at the hardware limit, against the peers, in one run.

1. Document encoding of the SciFact corpus: sentence-transformers fp32 ``encode`` and twotower's
   paths (fp32, default = bf16 weights, bf16 autocast, int8 dynamic quantization), interleaved
   on 256-document slices; docs/s, ratio to sentence-transformers, NDCG@10 / Recall@100.
2. Batch-1 query latency (tokenize + encode + exact search over the SciFact index), p50/p99, for
   torch and for the query tower on ONNX Runtime (``twotower onnx-query``, serve's default).
3. BM25: index build and queries/s for twotower, bm25s used directly, and rank_bm25 (same tokens).
4. The limit: fp32 and bf16 matmul throughput of this machine (a microbenchmark in this run, on
   the encoder's own GEMM shapes), the encoder's FLOPs per token, and the fraction reached; the
   attention kernel's rate in each precision, and from both the ceiling: the fastest each precision
   could encode with these kernels (dense layers at the matmul peak, attention at its kernel's rate).

    python benchmarks/speed.py [--limit N] [--latency-queries 300]
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from _common import (encoding_parser, interleaved, load_average, query_latency, st_encoder, test_documents,
                     vector_metrics, write_results)
from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import encode_texts
from twotower.encoders.onnx_runtime import OnnxTower
from twotower.encoders.towers import DualEncoder
from bm25_speed import bm25_rows


def matmul_gflops(dtype: torch.dtype, m: int, k: int, n: int, seconds: float = 2.0) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def encoder_flops(tower: TextEncoder, texts: list[str], batch_size: int, max_length: int) -> dict[str, float]:
    """Multiply-adds ×2 of the transformer on the batches the encoder really runs (length-sorted,
    padded per batch): ``dense`` (Q, K, V, O projections and the two FFN matmuls, per padded token) and
    ``attention`` (QKᵀ and AV)."""
    cfg = tower.backbone.config
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    ids = tower.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    lengths = sorted((len(x) for x in ids), reverse=True)
    dense = attention = 0.0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start : start + batch_size]
        width = batch[0]
        dense += layers * 2 * width * len(batch) * (4 * h * h + 2 * h * inter)
        attention += layers * 2 * 2 * len(batch) * width * width * h
    return {"dense": dense, "attention": attention}


def attention_gflops(dtype: torch.dtype, batch: int, heads: int, length: int, head_dim: int,
                     seconds: float = 2.0) -> float:
    """QKᵀ + AV GFLOP/s of ``scaled_dot_product_attention`` (the kernel the encoder runs) on the
    encoder's head shape, with a padding mask as the encoder passes one."""
    q, k, v = (torch.randn(batch, heads, length, head_dim).to(dtype) for _ in range(3))
    mask = torch.zeros(batch, 1, 1, length, dtype=dtype)
    mask[:, :, :, length - length // 16 :] = torch.finfo(dtype).min
    with torch.inference_mode():
        for _ in range(2):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            reps += 1
    return 2 * 2 * batch * heads * length * length * head_dim * reps / (time.perf_counter() - t0) / 1e9


def int8_tower(tower: TextEncoder) -> TextEncoder:
    import copy

    from torch.ao.quantization import quantize_dynamic

    backbone = quantize_dynamic(copy.deepcopy(tower.backbone), {torch.nn.Linear}, dtype=torch.qint8)
    return TextEncoder(backbone, tower.tokenizer, pooling=tower.pooling, normalize=tower.normalize,
                       projection=tower.projection, max_length=tower.max_length)


def main() -> None:
    ap = encoding_parser(__doc__)
    ap.add_argument("--latency-queries", type=int, default=300)
    args = ap.parse_args()
    load_start = load_average()

    ds, doc_ids, texts = test_documents(args)
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    full = len(doc_ids) == len(ds.corpus)

    st, st_encode = st_encoder(args)
    model = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)
    tower = model.doc_tower
    int8 = int8_tower(tower)

    def tt(precision, t=tower):
        return lambda items: encode_texts(t, items, batch_size=args.batch_size, max_length=args.max_length,
                                          precision=precision, show_progress=False)

    systems = {
        "sentence-transformers fp32": st_encode,
        "twotower fp32": tt("fp32"),
        "twotower default": tt("auto"),
        "twotower bf16-autocast": lambda items: _autocast_encode(tower, items, args),
        "twotower int8-dynamic": tt("fp32", int8),
    }
    out = interleaved(systems, texts)
    ref_s = out["sentence-transformers fp32"][1]
    ref = out["sentence-transformers fp32"][0]
    rows = []
    vecs = {}
    for name, (emb, secs) in out.items():
        vecs[name] = emb
        row = {"system": name, "docs_per_s": len(texts) / secs, "ratio_vs_st": ref_s / secs,
               "min_cosine_vs_st": float((emb * ref).sum(1).min())}
        if full:
            fn = systems[name] if name != "twotower default" else tt("auto")
            row.update(vector_metrics(ds.qrels, qids, fn(queries), doc_ids, emb))
        rows.append(row)
        print(row, flush=True)

    # the limit: matmul microbenchmarks on the encoder's GEMM shapes, FLOPs per token, fraction reached
    h = tower.backbone.config.hidden_size
    inter = tower.backbone.config.intermediate_size
    m = args.batch_size * 128
    peak = {
        "fp32": np.mean([matmul_gflops(torch.float32, m, h, inter), matmul_gflops(torch.float32, m, inter, h)]),
        "bf16": np.mean([matmul_gflops(torch.bfloat16, m, h, inter), matmul_gflops(torch.bfloat16, m, inter, h)]),
        "fp32_2048": matmul_gflops(torch.float32, 2048, 2048, 2048),
        "bf16_2048": matmul_gflops(torch.bfloat16, 2048, 2048, 2048),
    }
    cfg = tower.backbone.config
    attn_rate = {name: attention_gflops(dtype, args.batch_size, cfg.num_attention_heads, args.max_length,
                                        h // cfg.num_attention_heads)
                 for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    split = encoder_flops(tower, texts, args.batch_size, args.max_length)
    flops = split["dense"] + split["attention"]
    # the ceiling: the fastest this encoder could run at each precision if its dense layers ran at the matmul
    # peak and attention at the SDPA kernel's measured rate (LayerNorm, GELU, softmax's exp beyond the
    # kernel, tokenisation: free)
    ceiling = {p: len(texts) / (split["dense"] / (peak[p] * 1e9) + split["attention"] / (attn_rate[p] * 1e9))
               for p in ("fp32", "bf16")}
    n_tokens = sum(len(x) for x in tower.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"])
    st_docs_per_s = rows[0]["docs_per_s"]
    for row in rows:
        secs = len(texts) / row["docs_per_s"]
        row["gflops_per_s"] = flops / secs / 1e9
        p = {"sentence-transformers fp32": "fp32", "twotower fp32": "fp32",
             "twotower default": "bf16", "twotower bf16-autocast": "bf16"}.get(row["system"])
        if p:
            row["fraction_of_matmul_peak"] = row["gflops_per_s"] / peak[p]
            row["ceiling_docs_per_s"] = ceiling[p]
            row["fraction_of_ceiling"] = row["docs_per_s"] / ceiling[p]
            row["ceiling_ratio_vs_st"] = ceiling[p] / st_docs_per_s

    # batch-1 query latency: tokenize + encode + exact search over the SciFact index
    lat_queries = queries[: args.latency_queries]
    doc_vecs = vecs["twotower default"]
    onnx = OnnxTower(model.query_tower, max_length=args.max_length)  # fp32, checked against torch on probes
    lat = query_latency({
        "sentence-transformers fp32": lambda q: st.encode([q], convert_to_numpy=True, normalize_embeddings=True,
                                                          show_progress_bar=False),
        "twotower fp32": lambda q: encode_texts(model.query_tower, [q], precision="fp32", show_progress=False),
        "twotower default": lambda q: encode_texts(model.query_tower, [q], precision="auto", show_progress=False),
        "twotower onnx-query": lambda q: onnx.encode([q]),
    }, doc_vecs, lat_queries)
    onnx_row = {"system": "twotower onnx-query"}
    if full:  # ONNX Runtime query vectors against the fp32 document vectors
        onnx_row.update(vector_metrics(ds.qrels, qids, onnx.encode(queries), doc_ids, vecs["twotower fp32"]))
    rows.append(onnx_row)
    for row in rows:
        if row["system"] in lat:
            row.update({f"query_{k}": v for k, v in lat[row["system"]].items()})

    rows.extend(bm25_rows(ds, doc_ids if full else list(ds.corpus), queries))
    for row in rows[-3:]:
        print(row, flush=True)
    write_results("speed", rows, extra={"matmul_gflops": peak, "attention_gflops": attn_rate,
                                        "encoder_gflop_per_doc": flops / len(texts) / 1e9,
                                        "attention_share_of_flops": split["attention"] / flops,
                                        "encoder_flops_per_token": flops / n_tokens}, notes=(
        f"all-MiniLM-L6-v2, max length {args.max_length}, batch {args.batch_size}, {len(texts)} SciFact documents, "
        f"torch threads {torch.get_num_threads()}; load average {load_start:.1f} at start, {load_average():.1f} at end. "
        "Encoding systems take turns on 256-document slices. 'twotower default' = precision auto = bf16 weights on this "
        f"CPU. Matmul throughput measured in this run on the encoder's GEMM shapes ({m}×{h}×{inter} and "
        f"{m}×{inter}×{h}): fp32 {peak['fp32']:.0f} GFLOP/s, bf16 {peak['bf16']:.0f} GFLOP/s (2048³: fp32 "
        f"{peak['fp32_2048']:.0f}, bf16 {peak['bf16_2048']:.0f}). gflops_per_s = the transformer's dense + attention "
        f"FLOPs on the padded, length-sorted batches ({flops / n_tokens / 1e6:.1f} MFLOP per real token) divided by "
        "encoding time; fraction_of_matmul_peak divides it by the matmul rate of the same precision. The ceiling: "
        f"attention (QKᵀ + AV, {split['attention'] / flops:.1%} of the FLOPs) runs in scaled_dot_product_attention, "
        f"measured in this run on the encoder's head shape ({args.batch_size}×{cfg.num_attention_heads} heads × "
        f"{args.max_length} tokens × {h // cfg.num_attention_heads} dims, padding mask) at fp32 "
        f"{attn_rate['fp32']:.0f} and bf16 {attn_rate['bf16']:.0f} GFLOP/s; ceiling_docs_per_s = documents / (dense "
        "FLOPs / matmul rate + attention FLOPs / attention rate), everything else counted free, so "
        "ceiling_ratio_vs_st is the most a path of that precision could gain over sentence-transformers fp32 "
        "with these kernels on this CPU. Query latency: "
        "batch 1, tokenize + encode + exact top-10 over the corpus vectors, p50/p99 over the test queries, the systems "
        "taking turns in blocks of 50 queries; 'twotower onnx-query' = the query tower on ONNX Runtime (fp32; twotower serve's "
        "default query runtime), its NDCG against the fp32 document vectors. BM25 rows: same tokens (bm25s tokenizer, "
        "English stopwords, Snowball), k1 1.5, b 0.75; queries/s from the median of repeated passes over the queries "
        "(≥ 5 passes each and ≥ 2 s, twotower and bm25s taking turns pass by pass; rank_bm25: one pass)."))


def _autocast_encode(tower, items, args):
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        from twotower.encoders import inference

        return inference.encode_texts(tower, items, batch_size=args.batch_size, max_length=args.max_length,
                                      precision="fp32", show_progress=False)


if __name__ == "__main__":
    main()
