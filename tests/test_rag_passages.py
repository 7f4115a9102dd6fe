"""What a RAG framework gets from twotower (issue #70 item 3): each hit's best passage, not its whole document.

An index whose documents are split into several passages (the tiny test BERT, ``passage_window=32``) behind the
LangChain store and retriever and the LlamaIndex store and retriever. By default each returns the best passage for
the query as its text (``page_content`` / node text), exactly ``document_text[start:end]``, with the document's
metadata plus ``metadata["passage"]`` (document id, title, start, end, score, passage_score, page when known);
``whole_documents=True`` returns whole documents with their metadata exactly as given. Every ranking, score and
passage is checked against a brute force in numpy over the index's stored passage vectors and the encoder's own
query vector, and maximal marginal relevance against an MMR written here over each candidate's best-passage vector
(it used to read document rows as vector rows: the wrong vectors once a document has several passages)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from langchain_core.documents import Document
from llama_index.core.schema import MetadataMode
from llama_index.core.vector_stores.types import VectorStoreQuery

import twotower as tt
from twotower.integrations.langchain import TwoTowerRetriever, TwoTowerVectorStore
from twotower.integrations.llama_index import TwoTowerRetriever as LlamaRetriever
from twotower.integrations.llama_index import TwoTowerVectorStore as LlamaStore
from twotower.integrations.search import passage_place

WORDS = "alpha beta gamma delta epsilon zeta theta kappa sigma omega tea cat purr bone heart gene cell virus".split()
QUERIES = ["tea cat purr", "gene virus cell", "bone heart sigma", "omega alpha"]


def _texts() -> list[str]:
    rng = np.random.default_rng(11)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS, size=int(rng.integers(5, 10)))).capitalize() + "."

    long = [" ".join(sentence() for _ in range(10 + 3 * i)) for i in range(8)]
    return long + [sentence() for _ in range(3)]  # and three short ones: one passage, the whole text


TEXTS = _texts()
IDS = [f"doc{i}" for i in range(len(TEXTS))]
METAS = [{"group": i % 3, "id": 100 + i} for i in range(len(TEXTS))]


@pytest.fixture(scope="module")
def encoder(tiny_bert_dir):
    return tt.Encoder.load(str(tiny_bert_dir), precision="fp32")


@pytest.fixture(scope="module")
def lc_store(tiny_bert_dir, tmp_path_factory):
    store = TwoTowerVectorStore(tmp_path_factory.mktemp("rag") / "lc", encoder=str(tiny_bert_dir), precision="fp32",
                                passage_window=32)
    store.add_texts(TEXTS, METAS, ids=IDS)
    return store


class Reference:
    """The index's stored passage vectors read whole, and the encoder's query vector: every document scored by its
    best passage (MaxP) in numpy, nothing from the search path."""

    def __init__(self, index: tt.Index, encoder) -> None:
        store = index.store
        self.vectors = store.float_vectors(np.arange(store.manifest["num_vectors"]))
        self.offsets = np.asarray(store.offsets)
        self.spans = np.asarray(store.spans)
        self.rows = {doc_id: row for row, doc_id in enumerate(store.doc_ids)}
        self.encoder = encoder

    def query(self, text: str) -> np.ndarray:
        return self.encoder.encode_queries([text])[0]

    def best(self, q: np.ndarray, doc_id: str) -> tuple[int, float]:
        """The vector row of ``doc_id``'s best passage for ``q`` and its score (the first of equals)."""
        row = self.rows[doc_id]
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        scores = self.vectors[a:b] @ q
        return a + int(np.argmax(scores)), float(scores.max())

    def ranking(self, q: np.ndarray, allowed=None) -> list[tuple[str, float]]:
        scored = [(d, self.best(q, d)[1]) for d in self.rows if allowed is None or d in allowed]
        return sorted(scored, key=lambda kv: (-kv[1], self.rows[kv[0]]))

    def passage(self, q: np.ndarray, doc_id: str) -> tuple[int, int]:
        start, end = self.spans[self.best(q, doc_id)[0]]
        return int(start), int(end)


def mmr(query: np.ndarray, vectors: np.ndarray, lambda_mult: float, k: int) -> list[int]:
    """Maximal marginal relevance by its definition (Carbonell and Goldstein), cosine similarities: the most
    similar first, then each time the candidate maximising λ·sim(query) − (1−λ)·max sim(chosen); ties: the
    earlier candidate."""
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    to_query = v @ (query / np.linalg.norm(query))
    chosen = [int(np.argmax(to_query))]
    while len(chosen) < min(k, len(v)):
        best, best_score = -1, -np.inf
        for i in range(len(v)):
            if i in chosen:
                continue
            score = lambda_mult * to_query[i] - (1 - lambda_mult) * max(float(v[i] @ v[j]) for j in chosen)
            if score > best_score:
                best, best_score = i, score
        chosen.append(best)
    return chosen


@pytest.fixture(scope="module")
def ref(lc_store, encoder) -> Reference:
    ref = Reference(lc_store.index, encoder)
    assert all(np.diff(ref.offsets)[:8] > 1), "the long documents should have several passages each"
    assert all(np.diff(ref.offsets)[8:] == 1)
    return ref


def _check_passage(doc_id: str, text: str, place: dict, start: int, end: int, score: float) -> None:
    full = TEXTS[IDS.index(doc_id)]
    assert (place["document_id"], place["title"], place["start"], place["end"]) == (doc_id, "", start, end)
    assert text == full[start:end]
    assert len(text) < len(full) if doc_id in IDS[:8] else (start, end) == (0, len(full))  # long: a part of it
    assert place["score"] == pytest.approx(score, abs=1e-5)
    assert "page" not in place  # no page known: no key


# ---------------------------------------------------------------------------------------------- LangChain store


def test_langchain_store_returns_the_best_passage_by_default(lc_store, ref):
    for query in QUERIES:
        q = ref.query(query)
        want = ref.ranking(q)[:4]
        got = lc_store.similarity_search_with_score(query, k=4, mode="dense")
        assert [d.id for d, _ in got] == [d for d, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
        for (doc, score), (doc_id, best) in zip(got, want):
            place = doc.metadata["passage"]
            _check_passage(doc_id, doc.page_content, place, *ref.passage(q, doc_id), best)
            assert {k: v for k, v in doc.metadata.items() if k != "passage"} == METAS[IDS.index(doc_id)]
            assert place["passage_score"] == (None if doc_id in IDS[8:] else pytest.approx(best, abs=1e-5))
        by_vector = lc_store.similarity_search_by_vector(q.tolist(), k=4)
        assert [(d.id, d.page_content) for d in by_vector] == [(d.id, d.page_content) for d, _ in got]
    # a filter and a mode per call, and the retriever LangChain makes of the store, return passages too
    q = ref.query("tea cat purr")
    only = {d for d, m in zip(IDS, METAS) if m["group"] == 1}
    filtered = lc_store.similarity_search("tea cat purr", k=2, filter={"group": 1}, mode="dense")
    assert [d.id for d in filtered] == [d for d, _ in ref.ranking(q, only)[:2]]
    assert all(d.page_content == TEXTS[IDS.index(d.id)][slice(*ref.passage(q, d.id))] for d in filtered)
    for doc in lc_store.as_retriever(search_kwargs={"k": 3, "mode": "dense"}).invoke("tea cat purr"):
        assert doc.page_content == TEXTS[IDS.index(doc.id)][doc.metadata["passage"]["start"]:
                                                            doc.metadata["passage"]["end"]]


def test_langchain_store_whole_documents_on_request(lc_store, ref):
    whole = TwoTowerVectorStore(lc_store.path, whole_documents=True)
    assert whole.whole_documents and not lc_store.whole_documents
    q = ref.query("gene virus cell")
    got = whole.similarity_search_with_score("gene virus cell", k=4, mode="dense")
    assert [d.id for d, _ in got] == [d for d, _ in ref.ranking(q)[:4]]
    assert [d for d, _ in got] == [Document(page_content=TEXTS[IDS.index(d.id)], id=d.id,
                                            metadata=METAS[IDS.index(d.id)]) for d, _ in got]
    # get_by_ids: whole documents either way
    assert lc_store.get_by_ids(["doc3"]) == [Document(page_content=TEXTS[3], id="doc3", metadata=METAS[3])]
    with pytest.raises(tt.TwoTowerError, match="whole_documents: True"):
        TwoTowerVectorStore(whole_documents="yes")


@pytest.mark.parametrize("lambda_mult", [0.0, 0.3, 0.5, 0.8, 1.0])
def test_langchain_mmr_compares_best_passage_vectors(lc_store, ref, lambda_mult):
    differs = False
    for query in QUERIES:
        q = ref.query(query)
        candidates = [d for d, _ in ref.ranking(q)[:8]]
        best_rows = [ref.best(q, d)[0] for d in candidates]
        want = [candidates[i] for i in mmr(q, ref.vectors[best_rows], lambda_mult, k=4)]
        got = lc_store.max_marginal_relevance_search(query, k=4, fetch_k=8, lambda_mult=lambda_mult)
        assert [d.id for d in got] == want, query
        assert [d.id for d in lc_store.max_marginal_relevance_search_by_vector(
            q.tolist(), k=4, fetch_k=8, lambda_mult=lambda_mult)] == want
        for doc in got:  # each as its best passage, as a similarity search returns it
            assert (doc.metadata["passage"]["start"], doc.metadata["passage"]["end"]) == ref.passage(q, doc.id)
        # what the old code compared: document rows read as vector rows (the first passages of other documents)
        wrong = [candidates[i] for i in mmr(q, ref.vectors[[ref.rows[d] for d in candidates]], lambda_mult, k=4)]
        differs |= wrong != want
        if lambda_mult == 1.0:  # relevance alone: the similarity search's order (issue #70: it was not)
            assert want == [d.id for d in lc_store.similarity_search(query, k=4, mode="dense")]
    assert differs or lambda_mult == 0.0, "the rows read by mistake give the same choice here: a weak test"


def test_mmr_filter_and_whole_documents(lc_store, ref):
    q = ref.query("tea cat purr")
    only = {d for d, m in zip(IDS, METAS) if m["group"] != 1}
    candidates = [d for d, _ in ref.ranking(q, only)[:5]]
    want = [candidates[i] for i in mmr(q, ref.vectors[[ref.best(q, d)[0] for d in candidates]], 0.4, k=3)]
    got = TwoTowerVectorStore(lc_store.path, whole_documents=True).max_marginal_relevance_search(
        "tea cat purr", k=3, fetch_k=5, lambda_mult=0.4, filter={"group": {"$ne": 1}})
    assert [d.id for d in got] == want and all(d.page_content == TEXTS[IDS.index(d.id)] for d in got)


# -------------------------------------------------------------------------------------------- the retrievers


def test_retrievers_return_passages_by_default(lc_store, ref):
    index = lc_store.index
    for query in QUERIES[:2]:
        q = ref.query(query)
        want = ref.ranking(q)[:3]
        docs = TwoTowerRetriever(index, k=3, mode="dense").invoke(query)
        nodes = LlamaRetriever(index, k=3, mode="dense").retrieve(query)
        hits = index.search(query, k=3, mode="dense")
        assert [d.id for d in docs] == [n.node.ref_doc_id for n in nodes] == [d for d, _ in want]
        assert [d.score for d in docs] == [n.score for n in nodes] == [h.score for h in hits]  # Index.search's
        for doc, node, (doc_id, best) in zip(docs, nodes, want):
            start, end = ref.passage(q, doc_id)
            _check_passage(doc_id, doc.page_content, doc.metadata["passage"], start, end, best)
            _check_passage(doc_id, node.node.text, node.node.metadata["passage"], start, end, best)
            assert (node.node.start_char_idx, node.node.end_char_idx) == (start, end)
            assert node.node.id_ == node.node.ref_doc_id == doc_id
            assert doc.passages == [{"text": doc.page_content, "start": start, "end": end,
                                     "score": doc.metadata["passage"]["passage_score"],
                                     **({"page": None} if "page" in doc.passages[0] else {})}]
            # the place is metadata for the program, not text for the LLM or the embedding
            for mode in (MetadataMode.LLM, MetadataMode.EMBED):
                shown = node.node.get_content(metadata_mode=mode)
                assert "passage" not in shown and "document_id" not in shown and node.node.text in shown
                assert "group" in shown  # the document's own metadata still is


def test_retrievers_passages_n_and_whole_documents(lc_store, ref):
    index = lc_store.index
    q = ref.query("bone heart sigma")
    three = TwoTowerRetriever(index, k=2, passages=3, mode="dense").invoke("bone heart sigma")
    want = [d for d, _ in ref.ranking(q)[:2]]
    assert list(dict.fromkeys(d.id for d in three)) == want
    for doc_id in want:  # each hit's three best passages, best first, from the stored vectors
        row = ref.rows[doc_id]
        a, b = int(ref.offsets[row]), int(ref.offsets[row + 1])
        order = np.argsort(-(ref.vectors[a:b] @ q), kind="stable")[:3]
        spans = [tuple(int(x) for x in ref.spans[a + j]) for j in order]
        mine = [d for d in three if d.id == doc_id]
        assert [(d.metadata["passage"]["start"], d.metadata["passage"]["end"]) for d in mine] == spans
        assert all(d.page_content == TEXTS[IDS.index(doc_id)][s:e] for d, (s, e) in zip(mine, spans))
    nodes = LlamaRetriever(index, k=2, passages=3, mode="dense").retrieve("bone heart sigma")
    assert [(n.node.start_char_idx, n.node.end_char_idx) for n in nodes] == \
        [(d.metadata["passage"]["start"], d.metadata["passage"]["end"]) for d in three]
    assert [n.node.id_ for n in nodes] == [f"{n.node.ref_doc_id}:{n.node.start_char_idx}-{n.node.end_char_idx}"
                                           for n in nodes] and len({n.node.id_ for n in nodes}) == len(nodes)
    whole = TwoTowerRetriever(index, k=2, whole_documents=True, mode="dense").invoke("bone heart sigma")
    assert [(d.id, d.page_content, d.metadata) for d in whole] == [(i, TEXTS[IDS.index(i)], METAS[IDS.index(i)])
                                                                   for i in want]
    whole_nodes = LlamaRetriever(index, k=2, whole_documents=True, mode="dense").retrieve("bone heart sigma")
    assert [(n.node.id_, n.node.text, n.node.metadata) for n in whole_nodes] == \
        [(d.id, d.page_content, d.metadata) for d in whole]
    for make in (TwoTowerRetriever, LlamaRetriever):
        with pytest.raises(tt.TwoTowerError, match="whole_documents"):
            make(index, whole_documents=1)
        with pytest.raises(tt.TwoTowerError, match="passages"):
            make(index, passages=0)


# ---------------------------------------------------------------------------------------------- LlamaIndex store


def test_llama_index_store_over_a_passage_index(lc_store, ref, tmp_path):
    """A twotower index of long documents opened as a LlamaIndex store: each node found comes back as its best
    passage (its documents were not written by the store: a node of its text and metadata)."""
    store = LlamaStore(lc_store.path)
    for query in QUERIES[:3]:
        q = ref.query(query)
        want = ref.ranking(q)[:4]
        result = store.query(VectorStoreQuery(query_embedding=q.tolist(), similarity_top_k=4))
        assert result.ids == [d for d, _ in want]
        np.testing.assert_allclose(result.similarities, [s for _, s in want], atol=1e-5)
        for node, (doc_id, best) in zip(result.nodes, want):
            start, end = ref.passage(q, doc_id)
            assert node.node_id == doc_id
            _check_passage(doc_id, node.text, node.metadata["passage"], start, end, best)
            assert {k: v for k, v in node.metadata.items() if k != "passage"} == METAS[IDS.index(doc_id)]
            assert "passage" not in node.get_content(metadata_mode=MetadataMode.LLM)
    whole = LlamaStore(lc_store.path, whole_documents=True)
    got = whole.query(VectorStoreQuery(query_embedding=ref.query("omega alpha").tolist(), similarity_top_k=2))
    assert [(n.node_id, n.text, n.metadata) for n in got.nodes] == [(i, TEXTS[IDS.index(i)], METAS[IDS.index(i)])
                                                                   for i in got.ids]
    assert [n.text for n in store.get_nodes(["doc2"])] == [TEXTS[2]]  # get_nodes: whole nodes either way


def test_llama_index_store_nodes_keep_their_place_in_their_source():
    """A node added with its place in its source document (start_char_idx) comes back as its passage with that
    place moved onto the passage; the node's metadata gains only ``passage``."""
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

    store = LlamaStore()
    store.add([TextNode(id_="n1", text="Green tea is steamed.", embedding=[1.0, 0.0], start_char_idx=40,
                        end_char_idx=61, metadata={"k": 1},
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="src")}),
               TextNode(id_="n2", text="Coffee.", embedding=[0.0, 1.0])])
    result = store.query(VectorStoreQuery(query_embedding=[1.0, 0.2], similarity_top_k=2))
    first, second = result.nodes
    assert (first.text, first.start_char_idx, first.end_char_idx, first.ref_doc_id) == \
        ("Green tea is steamed.", 40, 61, "src")
    assert first.metadata == {"k": 1, "passage": {"document_id": "n1", "title": "", "start": 0, "end": 21,
                                                  "score": pytest.approx(result.similarities[0]),
                                                  "passage_score": None}}
    assert (second.start_char_idx, second.metadata["passage"]["end"]) == (None, 7)


def test_a_passage_knows_its_page_and_a_colliding_key_is_named():
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from twotower.integrations.search import passage_metadata

    paged = types.SimpleNamespace(text="x", start=3, end=4, score=0.5, page=7)
    assert passage_place("d", "T", 0.9, paged) == {"document_id": "d", "title": "T", "start": 3, "end": 4,
                                                   "score": 0.9, "passage_score": 0.5, "page": 7}
    unpaged = types.SimpleNamespace(text="x", start=3, end=4, score=None, page=None)
    assert "page" not in passage_place("d", "T", 0.9, unpaged)
    meta = {"a": [1]}
    out = passage_metadata("d", "", 0.9, unpaged, meta)
    assert out["a"] == [1] and out["a"] is not meta["a"] and meta == {"a": [1]}  # a copy, the original untouched
    store = TwoTowerVectorStore(embedding=DeterministicFakeEmbedding(size=8))
    store.add_texts(["green tea"], [{"passage": "mine"}], ids=["p"])
    with pytest.raises(tt.TwoTowerError, match="'p'.*holds a key 'passage'.*whole_documents=True"):
        store.similarity_search("tea", k=1)
    assert TwoTowerVectorStore(store.path, DeterministicFakeEmbedding(size=8), whole_documents=True) \
        .similarity_search("tea", k=1)[0].metadata == {"passage": "mine"}


def test_pages_reach_the_frameworks_when_passages_know_them(tiny_bert_dir, tmp_path):
    """A document read from a PDF (metadata ``page_starts``: where each page's text starts) gives each passage its
    page; both frameworks carry it in ``metadata["passage"]["page"]`` (runs where hits carry pages)."""
    import bisect
    import dataclasses

    from twotower.retrieval.passages import Passage

    if "page" not in {f.name for f in dataclasses.fields(Passage)}:
        pytest.skip("this twotower's passages carry no page")
    starts = [0, len(TEXTS[3]) // 3, 2 * len(TEXTS[3]) // 3]
    index = tt.Index.build(tmp_path / "pdf", [{"_id": "pdf", "title": "", "text": TEXTS[3], "page_starts": starts},
                                              {"_id": "txt", "title": "", "text": TEXTS[4]}],
                           encoder=str(tiny_bert_dir), precision="fp32", passage_window=32, show_progress=False)
    docs = TwoTowerRetriever(index, k=2, passages=3, mode="dense").invoke("gene virus cell")
    nodes = LlamaRetriever(index, k=2, passages=3, mode="dense").retrieve("gene virus cell")
    assert {d.id for d in docs} == {"pdf", "txt"} and len(nodes) == len(docs)
    for doc, node in zip(docs, nodes):
        place = doc.metadata["passage"]
        assert node.node.metadata["passage"] == place
        if doc.id == "pdf":
            assert place["page"] == max(1, bisect.bisect_right(starts, place["start"]))
        else:
            assert "page" not in place  # no pages known: no key
    assert {d.metadata["passage"].get("page") for d in docs if d.id == "pdf"} - {None}
