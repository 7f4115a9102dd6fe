"""BM25 over bm25s: scores checked against the Lucene formula computed by hand, and against
rank_bm25 on a real SciFact subset (same tokens, same idf variant)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from twotower.retrieval.bm25 import BM25, BM25Params

DOCS = ["the cat sat on the mat", "dogs chase cats", "a cat and a cat", "quantum physics lecture notes"]


def test_lucene_formula_by_hand():
    bm = BM25(BM25Params(k1=1.2, b=0.75, stemmer="")).index(["a", "b", "c", "d"], DOCS, show_progress=False)
    scores, idx = bm.search(["cat"], k=4, show_progress=False)
    # tokens after English stopwords: d0 [cat, sat, mat], d1 [dogs, chase, cats], d2 [cat, cat], d3 [quantum, physics, lecture, notes]
    lengths = [3, 3, 2, 4]
    avgdl = sum(lengths) / 4
    n, df = 4, 2
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))

    def s(tf, dl):
        return idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))

    expected = {2: s(2, 2), 0: s(1, 3)}
    got = {int(i): float(v) for i, v in zip(idx[0], scores[0]) if v > 0}
    assert got.keys() == expected.keys()
    for i in expected:
        assert got[i] == pytest.approx(expected[i], rel=1e-5)


def test_stemming_matches_inflections():
    bm = BM25().index(["a", "b", "c", "d"], DOCS, show_progress=False)
    _, idx = bm.search(["cats"], k=3, show_progress=False)
    assert set(idx[0][:3].tolist()) == {0, 1, 2}


def test_unknown_query_terms_score_zero():
    bm = BM25().index(["a", "b", "c", "d"], DOCS, show_progress=False)
    scores, _ = bm.search(["zzzz unknownword"], k=2, show_progress=False)
    assert np.all(scores == 0)


def test_empty_index_is_an_error():
    with pytest.raises(ValueError, match="the BM25 index is empty"):
        BM25().search(["x"])


def test_agrees_with_rank_bm25_on_scifact(scifact):
    """Same tokens, Lucene idf: bm25s scores equal rank_bm25's BM25Okapi with the idf swapped in."""
    from rank_bm25 import BM25Okapi

    from twotower.data.beir import BeirDataset

    ds = BeirDataset.load(scifact, "test")
    doc_ids = list(ds.corpus)[:800]
    texts = [ds.corpus[d].full_text for d in doc_ids]
    bm = BM25().index(doc_ids, texts, show_progress=False)
    tokenized = bm.tokenizer.tokenize(texts, update_vocab=False, return_as="string", show_progress=False)
    ref = BM25Okapi(tokenized, k1=1.5, b=0.75)
    df = Counter(w for doc in tokenized for w in set(doc))
    ref.idf = {w: math.log(1 + (ref.corpus_size - df[w] + 0.5) / (df[w] + 0.5)) for w in ref.idf}
    queries = list(ds.queries.values())[:20]
    scores, idx = bm.search(queries, k=10, show_progress=False)
    q_tokens = bm.tokenizer.tokenize(queries, update_vocab=False, return_as="string", show_progress=False)
    for row, qt in enumerate(q_tokens):
        expected = ref.get_scores(qt)
        # rank_bm25 multiplies every term by (k1 + 1); Lucene's variant does not
        assert np.allclose(scores[row] * (1.5 + 1), expected[idx[row]], rtol=1e-4, atol=1e-4)
        assert expected[idx[row][0]] == pytest.approx(expected.max(), rel=1e-4)
