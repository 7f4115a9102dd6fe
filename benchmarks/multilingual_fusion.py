"""Fusing BM25 with multilingual-e5-small on XQuAD-R: λ tuned on held-out questions vs the default λ 0.5, and RRF.

    python benchmarks/multilingual_fusion.py [--limit N]

XQuAD-R has no training split, so the questions are split in two by question id (``hybrid.dev_split``, seed 0,
half and half; a question and its 10 translations fall on the same side): λ ∈ {0, 0.1, …, 1} is picked on the
*dev* half by NDCG@10 (mAP on ``pool``), one λ per family of sets (the 11 monolingual sets together, ``to-en``,
``pool``), and every system is reported on the other half only. Each side contributes its top 100 (the searcher's
``HYBRID_N_BEST``: what ``twotower search --mode hybrid`` fuses), so mAP here is ``map_cut.100``. Uses the vectors
cached by ``benchmarks/multilingual.py`` (run that first; otherwise they are encoded here).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_results  # noqa: E402
from multilingual import E5, LANGS, _load, vectors  # noqa: E402

DEPTH = 100
METRICS = ("ndcg@10", "recall@100", "map@100")
GRID = tuple(round(x * 0.1, 1) for x in range(11))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=0, help="smoke: the first N questions per language (0 = all)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    args = ap.parse_args()

    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.bm25 import BM25, BM25Params
    from twotower.retrieval.dense import exact_search, to_run
    from twotower.retrieval.hybrid import dev_split, interpolate, rrf

    t_start = time.perf_counter()
    doc_ids, doc_texts, qids, q_texts, qrels = _load(args.limit)
    d_vecs, q_vecs, _ = vectors(E5, doc_ids, doc_texts, qids, q_texts, args.precision, None)
    d_pos, q_pos = {d: i for i, d in enumerate(doc_ids)}, {q: i for i, q in enumerate(qids)}
    base = sorted({q.split("-", 1)[1] for q in qids})
    dev_base, _ = dev_split(base, 0.5, seed=0)
    dev_base = set(dev_base)

    families = {"monolingual": [(lang, [d for d in doc_ids if d.startswith(f"{lang}-")], lang) for lang in LANGS],
                "to-en": [("to-en", [d for d in doc_ids if d.startswith("en-")], "multi")],
                "pool": [("pool", doc_ids, "multi")]}
    rows, tuning = [], {}
    for family, members in families.items():
        runs = {"dev": {"dense": {}, "bm25": {}}, "test": {"dense": {}, "bm25": {}}}
        fam_qrels = {}
        for set_name, s_docs, language in members:
            t0 = time.perf_counter()
            rel = qrels[set_name]
            s_qids = [q for q in qids if q in rel]
            bm25 = BM25(BM25Params(language=language)).index(s_docs, [doc_texts[d_pos[d]] for d in s_docs],
                                                            show_progress=False)
            s, i = bm25.search([q_texts[q_pos[q]] for q in s_qids], DEPTH, show_progress=False)
            sparse = to_run(s_qids, s_docs, s, i)
            s, i = exact_search(q_vecs[[q_pos[q] for q in s_qids]], d_vecs[[d_pos[d] for d in s_docs]], DEPTH)
            dense = to_run(s_qids, s_docs, s, i)
            for q in s_qids:  # key by set too: a monolingual family holds each question once per set anyway
                half = "dev" if q.split("-", 1)[1] in dev_base else "test"
                runs[half]["dense"][f"{set_name}/{q}"] = {f"{set_name}/{d}": v for d, v in dense[q].items()}
                runs[half]["bm25"][f"{set_name}/{q}"] = {f"{set_name}/{d}": v for d, v in sparse[q].items()}
                fam_qrels[f"{set_name}/{q}"] = {f"{set_name}/{d}": r for d, r in rel[q].items()}
            print(f"{set_name}: runs in {time.perf_counter() - t0:.1f} s", flush=True)
        key = "map@100" if family == "pool" else "ndcg@10"

        def score(run, half):
            q = {x: fam_qrels[x] for x in runs[half]["dense"]}
            return evaluate(q, run, METRICS)

        t0 = time.perf_counter()
        dev = runs["dev"]
        table = {lam: score(interpolate(dev["dense"], dev["bm25"], lam, n_best=DEPTH, top_k=DEPTH), "dev")[key]
                 for lam in GRID}
        best = max(GRID, key=lambda lam: (table[lam], -abs(lam - 0.5)))
        tuning[family] = {"metric": key, "dev_by_lambda": table, "lambda": best,
                          "dev_queries": len(dev["dense"]), "tune_s": time.perf_counter() - t0}
        test = runs["test"]
        systems = {"bm25": test["bm25"], E5: test["dense"],
                   "hybrid λ 0.5": interpolate(test["dense"], test["bm25"], 0.5, n_best=DEPTH, top_k=DEPTH),
                   f"hybrid λ {best} (tuned)": interpolate(test["dense"], test["bm25"], best, n_best=DEPTH,
                                                           top_k=DEPTH),
                   "rrf k 60": rrf([test["dense"], test["bm25"]], n_best=DEPTH, top_k=DEPTH)}
        for name, run in systems.items():
            m = score(run, "test")
            rows.append({"system": f"{name} {family}", "ndcg@10": m["ndcg@10"], "recall@100": m["recall@100"],
                         "map": m["map@100"], "test_queries": len(test["dense"])})
            print(rows[-1], flush=True)

    notes = (__doc__.split("\n\n", 2)[2].strip() + "\n\nTuned λ per family (dev " + ", ".join(
        f"{f}: {t['lambda']} by {t['metric']}" for f, t in tuning.items()) + "). Dev by λ:\n\n" + "\n".join(
        f"- {f}: " + ", ".join(f"{lam}: {v:.4f}" for lam, v in t["dev_by_lambda"].items()) for f, t in tuning.items())
        + f"\n\nTotal {time.perf_counter() - t_start:.0f} s.")
    name = "multilingual_fusion_smoke" if args.limit else "multilingual_fusion"
    write_results(name, rows, notes=notes, extra={"tuning": tuning, "depth": DEPTH, "limit": args.limit})
    print(f"wrote results/{name}.json and .md")


if __name__ == "__main__":
    main()
