"""Dense pseudo-relevance feedback (``--prf-depth`` / ``--prf-weight``, ``twotower.retrieval.prf``) on SciFact: does
Rocchio on the vectors help a monolingual English corpus, as it helps XQuAD-R's ``pool``
(``benchmarks/results/multilingual_train_hn1.md``)?

The dense retriever without feedback and with it, in one run on the same vectors: every (depth, weight) of a grid
scored on SciFact *train* (the dev role: its 809 judged queries against the same corpus), the best one chosen
there and reported on *test* beside the plain retriever.

    python benchmarks/prf_scifact.py [--model all-MiniLM-L6-v2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA, write_results  # noqa: E402

DEPTHS, WEIGHTS = (1, 2, 3, 5, 10), (0.25, 0.5, 1.0, 2.0)
METRICS = ("ndcg@10", "recall@100")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all-MiniLM-L6-v2")
    ap.add_argument("--data", default=str(DATA / "scifact"))
    args = ap.parse_args()
    from twotower.data.beir import BeirDataset
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.evaluation.metrics import evaluate
    from twotower.retrieval.dense import exact_search, to_run
    from twotower.retrieval.prf import search_with_feedback

    t_start = time.perf_counter()
    splits = {s: BeirDataset.load(args.data, s) for s in ("train", "test")}
    corpus = splits["test"].corpus
    doc_ids = list(corpus)
    model = DualEncoder.load(args.model)
    opts = EncodeOptions(precision="auto", show_progress=True)
    t0 = time.perf_counter()
    docs = model.encode_documents([corpus[d].full_text for d in doc_ids], opts)
    encode_s = time.perf_counter() - t0
    scores: dict[str, dict[tuple[int, float], dict]] = {}
    for split, ds in splits.items():
        qids = list(ds.queries)
        queries = model.encode_queries([ds.queries[q] for q in qids], opts)
        s, i = exact_search(queries, docs, 100)
        scores[split] = {(0, 0.0): evaluate(ds.qrels, to_run(qids, doc_ids, s, i), METRICS)}
        for depth in DEPTHS:
            for weight in WEIGHTS:
                s, i = search_with_feedback(queries, docs, 100, depth, weight)
                scores[split][(depth, weight)] = evaluate(ds.qrels, to_run(qids, doc_ids, s, i), METRICS)
        print(f"{split}: {len(scores[split])} settings scored", flush=True)
    best = max(scores["train"], key=lambda key: scores["train"][key]["ndcg@10"])
    rows = [{"system": f"{args.model} dense", "prf": "-", "chosen_on": "-", **scores["test"][(0, 0.0)]}]
    if best != (0, 0.0):
        rows.append({"system": f"{args.model} dense +prf", "prf": f"depth {best[0]}, weight {best[1]}",
                     "chosen_on": "train", **scores["test"][best]})
    grid = {split: {f"{d},{w}": round(m["ndcg@10"], 4) for (d, w), m in by.items()} for split, by in scores.items()}
    notes = (
        f"SciFact (5,183 documents), {args.model}, exact inner-product search, each query's top 100. Feedback: "
        "q' = (q + weight · mean of the depth best documents' vectors) / (1 + weight), then search again. The "
        "setting is chosen by NDCG@10 on train (809 queries) among no feedback and depth ∈ "
        f"{{{', '.join(map(str, DEPTHS))}}} × weight ∈ {{{', '.join(map(str, WEIGHTS))}}}; chosen: "
        + ("none (no feedback is best on train)" if best == (0, 0.0) else f"depth {best[0]}, weight {best[1]}")
        + ". NDCG@10 of every setting (`depth,weight`; `0,0.0` = none):\n\n"
        + "\n".join(f"- {split}: " + ", ".join(f"{k} {v:.4f}" for k, v in g.items()) for split, g in grid.items())
        + f"\n\nEncoding the corpus: {encode_s:.0f} s; total {time.perf_counter() - t_start:.0f} s."
    )
    path = write_results("prf_scifact", rows, notes=notes, extra={"grid_ndcg@10": grid, "chosen": list(best)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
