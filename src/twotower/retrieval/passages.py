"""The passage of a hit: which part of a long document matched a query, with its exact place in the text.

An index that splits long documents (:mod:`twotower.encoders.passages`) keeps each passage's ``(start, end)``
character offsets into its document's text beside its vector. A hit's best passages are the document's passages
ranked by the query vector's inner product with theirs (the same scores that ranked the document: MaxP), or, when
the search had no query vector (``bm25`` mode), by the query's BM25 score over the document's passages (each passage
a document of a small collection, the document's passages: a word every passage holds weighs little, a rare one
much; terms as the index's BM25 reads them: its analyzer's Unicode NFKC and case folding, stopwords and stemming, so
``Tea``, ``TEA`` and ``tea`` are one word, and so are ``Straße`` and ``STRASSE``, or an accented letter written as
one character or as two). A hybrid search weighs both (:func:`best_passages`' ``lexical``). A document of one
passage (short, or an index without passages) has its whole text as its passage. ``text[start:end] ==
passage.text`` always.

Example::

    from twotower.retrieval.passages import best_passages

    [[best]] = best_passages(store, [row], [doc["text"]], queries=q_vecs[:1], query_texts=["green tea"])
    print(best.text, best.start, best.end, best.score)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from twotower.data.language import WORD, normalize


@dataclass(frozen=True)
class Passage:
    """A part of a hit's document: ``text`` is ``document_text[start:end]`` (character offsets); ``score``: the
    query's score for it (inner product; in ``bm25`` mode the query's BM25 score over the document's passages;
    None for a whole short document); ``page``: the 1-based page it starts on, for a document read from a PDF (its
    ``page_starts`` metadata: :mod:`twotower.data.files`; such a document's passages never cross a page), else
    None."""

    text: str
    start: int
    end: int
    score: float | None = None
    page: int | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "start": self.start, "end": self.end, "score": self.score, "page": self.page}


def spans_of(store, row: int, text: str) -> np.ndarray:
    """The ``(start, end)`` spans of document ``row``'s passages (one span over the whole ``text`` when the index
    keeps no passages)."""
    spans = getattr(store, "spans", None)
    if spans is None or getattr(store, "offsets", None) is None:
        return np.array([[0, len(text)]], dtype=np.int64)
    a, b = int(store.offsets[row]), int(store.offsets[row + 1])
    return np.asarray(spans[a:b], dtype=np.int64)


def _folded_words(texts: Sequence[str]) -> list[list[str]]:
    """Each text's words after NFKC and case folding (an index without BM25 params: no stopwords, no stems)."""
    return [WORD.findall(normalize(t)) for t in texts]


@lru_cache(maxsize=16)
def _analyzer(language: str, stopwords: str | None, stemmer: str | None):
    from twotower.retrieval.analyzers import analyzer_for

    return analyzer_for(language, stopwords=stopwords, stemmer=stemmer)


def passage_terms(store):
    """A function from texts to their terms as ``store``'s BM25 side reads them (its language's analyzer: NFKC and
    case folding, stopwords, stemming); folded words for an index without BM25 params."""
    saved = (getattr(store, "manifest", None) or {}).get("bm25")
    if not saved:
        return _folded_words
    from twotower.retrieval.bm25 import BM25Params

    params = BM25Params.from_dict(saved)
    return _analyzer(params.language, params.stopwords, params.stemmer).analyze


def lexical_scores(query: str, parts: Sequence[str], terms=_folded_words) -> np.ndarray:
    """The BM25 score (bm25s, Lucene's idf, k1 1.2, b 0.75) of ``query`` for each of ``parts``, the parts being the
    whole collection (a document's passages): a term in every part weighs little, a rare one much. ``terms``:
    texts to terms (:func:`passage_terms`). 0 for every part when no query term occurs in any."""
    import bm25s

    tokens = terms(list(parts) + [query])
    query_terms, tokens = set(tokens[-1]), tokens[:-1]
    if not any(query_terms.intersection(t) for t in tokens):
        return np.zeros(len(parts), dtype=np.float32)
    scorer = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    scorer.index([t or [""] for t in tokens], show_progress=False)  # "": a part of no term (no query holds it)
    known = [t for t in query_terms if t in scorer.vocab_dict]
    return np.asarray(scorer.get_scores(known), dtype=np.float32)


def best_passages(store, rows: Sequence[int], texts: Sequence[str], *, queries: np.ndarray | None = None,
                  query_texts: Sequence[str] | None = None, n: int = 1,
                  metadatas: Sequence[dict] | None = None, lexical: float = 0.0) -> list[list[Passage]]:
    """For each hit (document ``rows[i]`` with text ``texts[i]``, found for query ``i``), its ``n`` best passages,
    best first (ties: the earlier passage). ``queries``: one query vector per hit (as encoded for the search),
    else ``query_texts`` rank by query words. ``lexical`` (a hybrid search's BM25 weight, 1 − λ) chooses by both
    sides: each passage's inner product and its BM25 score (:func:`lexical_scores`), each min-max scaled over the
    document's passages, weighed ``1 − lexical`` and ``lexical`` (the passage's score is that blend, in [0, 1]).
    ``metadatas``: the documents' metadata, for a PDF's pages."""
    from twotower.data.files import page_of

    out = []
    # a Milvus index: its passages' spans and vectors, read for all the hits at once (a row each: .milvus.passages)
    table = store.passage_table(rows) if getattr(store, "passages", None) and hasattr(store, "passage_table") \
        else None
    terms = passage_terms(store)
    for i, (row, text) in enumerate(zip(rows, texts)):
        whole = np.array([[0, len(text)]], dtype=np.int64)
        spans = spans_of(store, int(row), text) if table is None else table.get(int(row), (whole, None))[0]
        starts = (metadatas[i] or {}).get("page_starts") if metadatas is not None else None
        if len(spans) == 1:
            a, b = int(spans[0, 0]), int(spans[0, 1])
            out.append([Passage(text[a:b], a, b, page=page_of(starts, a))])
            continue
        parts = [text[int(a):int(b)] for a, b in spans]
        if queries is not None:
            q = store.project_queries(np.asarray(queries[i : i + 1], dtype=np.float32))[0]
            if table is not None:
                vecs = table[int(row)][1]
            else:
                first = int(store.offsets[row])
                vecs = store.codec.decode(np.asarray(store.vectors[first : first + len(spans)]))
            scores = vecs @ q
            if lexical > 0 and query_texts is not None:
                words = lexical_scores(query_texts[i], parts, terms)
                scores = (1 - lexical) * _scaled(scores) + lexical * _scaled(words)
        else:
            scores = lexical_scores(query_texts[i] if query_texts is not None else "", parts, terms)
        order = np.argsort(-scores, kind="stable")[: max(1, n)]
        out.append([Passage(parts[j], int(spans[j, 0]), int(spans[j, 1]), float(scores[j]),
                            page_of(starts, int(spans[j, 0]))) for j in order])
    return out


def ranked_passages(store, ranked: Sequence[tuple[str, float]], query: str, query_vector: np.ndarray | None = None,
                    n: int = 1, lexical: float = 0.0) -> list[tuple[dict, list[Passage]]]:
    """One query's ``ranked`` ``(id, score)`` hits over ``store`` (one version) as ``(document, its n best passages)``
    pairs: each document as ``store.document`` gives it, its passages by :func:`best_passages` (``query_vector``: as
    the search encoded the query; None: by ``query``'s words; ``lexical``: both)."""
    rows = [store.row_of[d] for d, _ in ranked]
    docs = [store.document(r) for r in rows]
    vectors = None if query_vector is None else np.repeat(np.asarray(query_vector)[None], len(rows), axis=0)
    best = best_passages(store, rows, [doc["text"] for doc in docs], n=n, queries=vectors,
                         query_texts=[query or ""] * len(rows), metadatas=[doc.get("metadata") for doc in docs],
                         lexical=lexical)
    return list(zip(docs, best))


def lexical_weight(mode: str, lam: float) -> float:
    """The query words' share in choosing a hit's best passage (:func:`best_passages`' ``lexical``): a hybrid
    search's BM25 weight ``1 − λ``, half for RRF, none for dense and BM25 (BM25 mode ranks by the words alone)."""
    return 1.0 - lam if mode == "hybrid" else 0.5 if mode == "rrf" else 0.0


def _scaled(scores: np.ndarray) -> np.ndarray:
    """``scores`` min-max scaled to [0, 1] (all equal: all 0)."""
    scores = np.asarray(scores, dtype=np.float64)
    span = float(scores.max() - scores.min())
    return np.zeros_like(scores) if span <= 0 else (scores - scores.min()) / span


def best_vector_rows(store, queries: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
    """The vector row of each document in ``doc_rows`` (n_queries, d) that scores best for its query (``queries``:
    projected vectors, one per row of ``doc_rows``): where pseudo-relevance feedback reads a passage index's
    document vectors."""
    if store.offsets is None:  # every document one vector: its row
        return doc_rows
    out = np.empty_like(doc_rows)
    for i, docs in enumerate(doc_rows):
        for j, row in enumerate(docs):
            a, b = int(store.offsets[row]), int(store.offsets[row + 1])
            scores = store.codec.decode(np.asarray(store.vectors[a:b])) @ queries[i]
            out[i, j] = a + int(np.argmax(scores))
    return out
