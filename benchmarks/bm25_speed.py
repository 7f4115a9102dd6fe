"""BM25 speed on SciFact: twotower's BM25 against bm25s used directly and rank_bm25, same tokens.

Index build seconds and queries/s over the SciFact test queries (top-10), with the tokenisation of the
queries included. twotower's BM25 is bm25s underneath, so the claim is "no overhead": twotower and
bm25s take turns pass by pass (alternating order) and each reports the median pass. rank_bm25 (pure
Python scoring of every document) is timed over one pass. Also part of ``speed.py``.

    python benchmarks/bm25_speed.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _common import DATA, load_average, write_results


def median_seconds(fns: dict, min_seconds: float = 2.0, min_repeats: int = 5) -> dict[str, float]:
    """Median wall time of one pass per function, the functions taking turns pass by pass in
    alternating order (at least ``min_repeats`` rounds and ``min_seconds``); one pass over 300 queries
    takes ~40 ms, too short to time once. ``min_seconds=0`` times one pass each."""
    names = list(fns)
    for n in names:  # warm-up
        fns[n]()
    times, start = {n: [] for n in names}, time.perf_counter()
    while len(times[names[0]]) < (min_repeats if min_seconds else 1) or time.perf_counter() - start < min_seconds:
        for n in names if len(times[names[0]]) % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return {n: float(np.median(t)) for n, t in times.items()}


def bm25_rows(ds, doc_ids, queries) -> list[dict]:
    import bm25s
    from rank_bm25 import BM25Okapi

    from twotower.retrieval.bm25 import BM25

    texts = [ds.corpus[d].full_text for d in doc_ids]
    build = {}
    t0 = time.perf_counter()
    ours = BM25().index(doc_ids, texts, show_progress=False)
    build["twotower bm25"] = time.perf_counter() - t0

    tok = ours.tokenizer
    t0 = time.perf_counter()
    raw = bm25s.BM25(k1=1.5, b=0.75)
    raw.index(tok.tokenize(texts, update_vocab=False, return_as="tuple", show_progress=False), show_progress=False)
    build["bm25s direct"] = time.perf_counter() - t0
    secs = median_seconds({
        "twotower bm25": lambda: ours.search(queries, 10, show_progress=False),
        "bm25s direct": lambda: raw.retrieve(tok.tokenize(queries, update_vocab=False, return_as="ids",
                                                          show_progress=False), k=10, show_progress=False),
    })
    rows = [{"system": n, "build_s": build[n], "queries_per_s": len(queries) / secs[n]} for n in secs]

    strings = tok.tokenize(texts, update_vocab=False, return_as="string", show_progress=False)
    q_strings = tok.tokenize(queries, update_vocab=False, return_as="string", show_progress=False)
    t0 = time.perf_counter()
    ref = BM25Okapi(strings, k1=1.5, b=0.75)
    build = time.perf_counter() - t0
    def rank_search():
        for q in q_strings:
            np.argsort(-ref.get_scores(q))[:10]

    rows.append({"system": "rank_bm25", "build_s": build,
                 "queries_per_s": len(queries) / median_seconds({"rank_bm25": rank_search}, min_seconds=0.0)["rank_bm25"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DATA / "scifact"))
    args = ap.parse_args()
    from twotower.data.beir import BeirDataset

    load_start = load_average()
    ds = BeirDataset.load(args.data, "test")
    queries = list(ds.queries.values())
    rows = bm25_rows(ds, list(ds.corpus), queries)
    ours, raw = rows[0]["queries_per_s"], rows[1]["queries_per_s"]
    for row in rows:
        row["ratio_vs_bm25s"] = row["queries_per_s"] / raw
        print(row, flush=True)
    write_results("bm25_speed", rows, notes=(
        f"{len(ds.corpus)} SciFact documents, {len(queries)} test queries, top-10; k1 1.5, b 0.75, "
        "the bm25s tokenizer with English stopwords and Snowball stemming for all three. twotower and bm25s took "
        "turns pass by pass (≥ 5 passes each and ≥ 2 s), rank_bm25 one pass. twotower / bm25s = "
        f"{ours / raw:.2f}. Load average {load_start:.1f} at start, {load_average():.1f} at end."))


if __name__ == "__main__":
    main()
