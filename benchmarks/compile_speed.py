"""torch.compile as an encoding path: sentence-transformers fp32, twotower eager and twotower compiled, in one run.

Every system encodes the same SciFact documents in interleaved 256-document slices (so load from
other processes falls on all alike). The compiled systems are compiled before the timed slices; their
compile time (Inductor, dynamic shapes, first call on 64 documents, minus that call's eager time) is
reported apart, and ``docs_per_s_incl_compile`` charges it to the run. On a CPU with fast bf16
(AMX / AVX512-BF16) the default precision (bf16 weights) is measured eager and compiled as well.

Rows: ``docs_per_s``, ``ratio_vs_st``, ``speedup_vs_eager`` (same precision), ``compile_s``,
``docs_per_s_incl_compile``, ``max_abs_diff_vs_eager`` and, on the whole corpus (``--limit 0``),
NDCG@10 / Recall@100 on SciFact test (queries encoded eagerly at the row's precision).

    python benchmarks/compile_speed.py              # whole corpus, ~25 min on 2 AVX2 cores
    python benchmarks/compile_speed.py --limit 512  # speed only
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# a cold compile, as a first-time user pays it: Inductor's on-disk cache starts empty
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-cold-"))

import numpy as np
import torch

from _common import (encoding_parser, interleaved, load_average, st_encoder, test_documents, vector_metrics,
                     write_results)
from twotower.encoders.inference import cpu_has_fast_bf16, encode_texts
from twotower.encoders.towers import DualEncoder


def main() -> None:
    args = encoding_parser(__doc__).parse_args()
    load_start = load_average()
    ds, doc_ids, texts = test_documents(args)
    full = len(doc_ids) == len(ds.corpus)
    _, st_encode = st_encoder(args)
    model = DualEncoder.load(query_max_length=args.max_length, doc_max_length=args.max_length)
    tower = model.doc_tower
    precisions = ("fp32", "auto") if cpu_has_fast_bf16() else ("fp32",)
    label = {"fp32": "fp32", "auto": "default"}

    def tt(precision, compile):
        return lambda items: encode_texts(tower, items, batch_size=args.batch_size, max_length=args.max_length,
                                          precision=precision, show_progress=False, compile=compile)

    systems = {"sentence-transformers fp32": st_encode}
    precision_of = {"sentence-transformers fp32": "fp32"}
    compile_s = {}
    for p in precisions:
        systems[f"twotower {label[p]}"] = tt(p, False)
        systems[f"twotower {label[p]} compiled"] = tt(p, True)
        precision_of[f"twotower {label[p]}"] = precision_of[f"twotower {label[p]} compiled"] = p
        probe = texts[:64]
        systems[f"twotower {label[p]}"](probe)
        t0 = time.perf_counter()
        systems[f"twotower {label[p]}"](probe)
        eager_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        systems[f"twotower {label[p]} compiled"](probe)
        compile_s[p] = time.perf_counter() - t0 - eager_s
        print(f"compiled {label[p]} in {compile_s[p]:.1f} s", flush=True)
    out = interleaved(systems, texts)

    ref, ref_s = out["sentence-transformers fp32"]
    queries = [ds.queries[q] for q in ds.queries]
    rows = []
    for name, (emb, secs) in out.items():
        row = {"system": name, "docs_per_s": len(texts) / secs, "ratio_vs_st": ref_s / secs}
        p = precision_of[name]
        if name.endswith(" compiled"):
            eager_emb, eager_s = out[name.removesuffix(" compiled")]
            row.update(speedup_vs_eager=eager_s / secs, compile_s=compile_s[p],
                       docs_per_s_incl_compile=len(texts) / (secs + compile_s[p]),
                       max_abs_diff_vs_eager=float(np.abs(emb - eager_emb).max()))
        if full:
            q_vecs = (st_encode(queries) if name.startswith("sentence") else
                      encode_texts(model.query_tower, queries, precision=p, show_progress=False))
            row.update(vector_metrics(ds.qrels, list(ds.queries), q_vecs, doc_ids, emb))
        rows.append(row)
        print(row, flush=True)
    write_results("compile_speed", rows, notes=(
        f"all-MiniLM-L6-v2, max length {args.max_length}, batch {args.batch_size}, {len(texts)} SciFact documents, "
        f"torch threads {torch.get_num_threads()}; load average {load_start:.1f} at start, {load_average():.1f} at end. "
        "Systems take turns on 256-document slices. 'compiled' = encode_texts(compile=True): torch.compile(tower, "
        "dynamic=True), Inductor's default CPU settings, plus freezing (weights as pre-packed constants) on the "
        "default path, whose bf16 copy of the weights never changes; compile_s = first compiled call on 64 documents minus an "
        "eager call on the same documents, with Inductor's on-disk cache empty (TORCHINDUCTOR_CACHE_DIR = "
        f"{os.environ['TORCHINDUCTOR_CACHE_DIR']}); docs_per_s_incl_compile charges it to this corpus."))


if __name__ == "__main__":
    main()
