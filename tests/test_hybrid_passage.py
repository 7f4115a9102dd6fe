"""In hybrid mode a hit's best passage is chosen by both sides (issue #70 item 5): λ weighs the passages' dense
scores against the query's BM25 over the document's passages, each min-max scaled over the document's passages."""

from __future__ import annotations

import numpy as np

import twotower as tt

FILLER = ["Rivers carry sediment down to the sea over many years.", "Mountains rise where plates collide slowly.",
          "Forests store carbon in their wood and soil.", "Deserts receive little rain during the year."]


def _doc() -> str:
    sentences = [FILLER[i % 4] for i in range(40)]
    sentences[27] = "The zeppelin hangar in Friedrichshafen housed a quokka named Walter."
    return " ".join(sentences)


def _expected(index, query: str, lam: float) -> tuple[int, int]:
    """(start of the passage hybrid should pick, start of the dense-best passage), computed from the stored spans and
    vectors and a Lucene BM25 written out in conftest over the index's analyzer's terms."""
    from conftest import lucene_bm25

    from twotower.retrieval.analyzers import analyzer_for

    store = index.store
    row = store.row_of["long"]
    a, b = int(store.offsets[row]), int(store.offsets[row + 1])
    spans = np.asarray(store.spans[a:b])
    vecs = store.codec.decode(np.asarray(store.vectors[a:b]))
    q = index.encoder.encode_queries([query])[0]
    dense = vecs @ store.project_queries(q[None].astype(np.float32))[0]
    text = _doc()
    terms = analyzer_for(store.manifest["bm25"]["language"]).analyze([text[s:e] for s, e in spans] + [query])
    counts = np.array(lucene_bm25(terms[-1], terms[:-1]))

    def scaled(x):
        return np.zeros_like(x) if x.max() == x.min() else (x - x.min()) / (x.max() - x.min())

    blend = lam * scaled(dense) + (1 - lam) * scaled(counts)
    return int(spans[int(np.argmax(blend)), 0]), int(spans[int(np.argmax(dense)), 0])


def test_hybrid_best_passage_weighs_dense_against_query_words(tmp_path, tiny_bert_dir):
    index = tt.Index.build(tmp_path / "idx", {"long": _doc(), "short": "A note on tea."}, encoder=str(tiny_bert_dir),
                           passage_window=40, bm25=True, precision="fp32", show_progress=False)
    assert index.info()["num_vectors"] > 5
    # a query whose dense-best passage is not the one holding its words (the random model's vectors pick one)
    queries = ["zeppelin quokka Walter", "quokka named Walter", "Friedrichshafen hangar", "housed a quokka",
               "zeppelin hangar", "Walter", "the quokka", "a zeppelin in Friedrichshafen"]
    query = next((q for q in queries if _expected(index, q, 0.0)[0] != _expected(index, q, 0.0)[1]), None)
    assert query is not None, "every query's dense-best passage holds its words: no case tells the sides apart"
    for lam in (0.0, 0.3, 1.0):
        want, dense_best = _expected(index, query, lam)
        hit = next(h for h in index.search(query, k=2, mode="hybrid", lam=lam) if h.id == "long")
        assert hit.passage.start == want, lam
    lexical = next(h for h in index.search(query, k=2, mode="hybrid", lam=0.0) if h.id == "long")
    assert "quokka" in lexical.passage.text  # all weight on the words: the passage with them
    dense = next(h for h in index.search(query, k=2, mode="dense") if h.id == "long")
    assert dense.passage.start == dense_best  # dense mode: the vectors alone, as before
