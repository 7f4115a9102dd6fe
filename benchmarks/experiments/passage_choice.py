"""Which passage of a long document a hit shows (issue #70 item 5), on questions whose answer's place is known:
SciFact abstracts joined ten to a document (benchmarks/long_documents.py's construction), a query's relevant abstract
being its answer. For dense, BM25 and hybrid searches with the defaults: how often the hit's best passage, and one of
its top 3, lie on the relevant abstract (at least half of the shorter of the two overlapping), over the (query,
document) pairs whose document is in the top 10. Beside it, the rule the lexical side replaced, computed here from
the same spans: a raw count of the query's words in each passage instead of BM25 over the document's passages.

The split is SciFact **train** (the passage rule was chosen on it); ``--split test`` measures on test.

    python benchmarks/experiments/passage_choice.py --work <work-dir> [--split train] [--queries 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DATA, write_results  # noqa: E402
from long_documents import joined_collection  # noqa: E402


def abstract_spans(docs) -> dict[str, list[tuple[int, int]]]:
    """Each joined document's abstracts as character spans of its text (joined by a blank line)."""
    out = {}
    for d in docs:
        pos, spans = 0, []
        for part in d["text"].split("\n\n"):
            spans.append((pos, pos + len(part)))
            pos += len(part) + 2
        out[d["_id"]] = spans
    return out


def on_answer(a: int, b: int, span: tuple[int, int]) -> bool:
    return min(b, span[1]) - max(a, span[0]) >= 0.5 * min(b - a, span[1] - span[0])


def count_rule(index, query: str, doc_id: str, text: str, lexical: float):
    """(start, end) of the passage the replaced rule chose: the dense score against a raw count of the query's
    words (folded), each min-max scaled, weighed ``lexical``; the count alone with ``lexical`` 1."""
    import regex

    from twotower.data.language import normalize
    from twotower.retrieval.passages import spans_of

    store = index.store
    row = store.row_of[doc_id]
    spans = spans_of(store, row, text)
    words = set(regex.findall(r"\w+", normalize(query)))
    counts = np.array([sum(w in words for w in regex.findall(r"\w+", normalize(text[a:b]))) for a, b in spans], float)

    def scaled(x):
        return np.zeros_like(x) if x.max() == x.min() else (x - x.min()) / (x.max() - x.min())

    if lexical >= 1:
        score = counts
    else:
        first = int(store.offsets[row])
        vecs = store.codec.decode(np.asarray(store.vectors[first : first + len(spans)]))
        q = index.encoder.encode_queries([query])[0]
        score = (1 - lexical) * scaled(vecs @ store.project_queries(q[None].astype(np.float32))[0]) \
            + lexical * scaled(counts)
    j = int(np.argmax(score))
    return int(spans[j, 0]), int(spans[j, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--abstracts", type=int, default=600)
    args = ap.parse_args()
    import twotower as tt

    ds = tt.load_beir(DATA / "scifact", split=args.split)
    qrels = dict(sorted(ds.qrels.items())[: args.queries])
    docs, queries, pairs = joined_collection(ds.corpus, ds.queries, qrels, args.abstracts, seed=1)
    path = args.work / "index"
    index = tt.Index.open(path) if (path / "CURRENT").exists() else tt.Index.build(path, docs)
    where = abstract_spans(docs)
    text_of = {d["_id"]: d["text"] for d in docs}
    items = sorted(pairs.items())
    rows = []
    for mode in ("dense", "bm25", "hybrid"):
        hits = index.search([queries[q] for (q, _), _ in items], k=10, mode=mode, passages=3)
        found = best = top3 = old = 0
        for ((q, d), pos), hs in zip(items, hits):
            hit = next((h for h in hs if h.id == d), None)
            if hit is None:
                continue
            found += 1
            span = where[d][pos]
            best += on_answer(hit.passage.start, hit.passage.end, span)
            top3 += any(on_answer(p.start, p.end, span) for p in hit.passages[:3])
            if mode != "dense":
                old += on_answer(*count_rule(index, queries[q], d, text_of[d], 1.0 if mode == "bm25" else 0.5), span)
        rows.append({"system": f"twotower {mode}", "pairs": len(items), "found_top10": found,
                     "best_passage_on_answer": round(best / max(found, 1), 4),
                     "top3_on_answer": round(top3 / max(found, 1), 4),
                     "best_by_word_count_rule": round(old / max(found, 1), 4) if mode != "dense" else None})
    write_results(f"passage_choice_{args.split}", rows,
                  notes=f"SciFact {args.split}: the relevant abstracts of {len(qrels)} queries plus random others, "
                        f"{args.abstracts} abstracts joined ten to a document ({len(docs)} documents, "
                        f"{index.info()['num_vectors']} passages), tt.Index.build's defaults (all-MiniLM-L6-v2, 256-token "
                        "passages, BM25). best_by_word_count_rule: the same hits' best passage by the rule replaced "
                        "(a raw count of query words; hybrid: against the dense score, λ 0.5).")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
