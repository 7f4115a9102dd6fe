"""LangChain's own standard suites against twotower: ``VectorStoreIntegrationTests`` for
:class:`TwoTowerVectorStore` with twotower's encoder (the tiny test BERT) and with LangChain's fake embeddings
(``get_embeddings()``, the suite's own), and ``EmbeddingsIntegrationTests`` for :class:`TwoTowerEmbeddings`; then
what the suites leave out: metadata keys that name a document's own fields elsewhere, filters, MMR, reopening,
ids (strings only, one id twice in a call), what ``delete`` returns and that it never empties the store unasked.

The vector-store suite expects a search to return each document exactly as it was added, metadata included; the
store returns each hit's best passage with ``metadata["passage"]`` added (tests/test_rag_passages.py), so the suite
runs on stores made with ``whole_documents=True``, the mode that returns documents as added."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, VectorStoreIntegrationTests

from twotower.integrations.langchain import TwoTowerEmbeddings, TwoTowerVectorStore


class _Anyio:
    """The suites' async tests run under anyio, on asyncio."""

    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def anyio_backend(self):
        return "asyncio"


class TestWithFakeEmbeddings(_Anyio, VectorStoreIntegrationTests):
    """The suite's own store set-up: LangChain's DeterministicFakeEmbedding."""

    @pytest.fixture
    def vectorstore(self, tmp_path):
        store = TwoTowerVectorStore(tmp_path / "store", embedding=self.get_embeddings(), whole_documents=True)
        yield store
        store.delete(delete_all=True)


class TestWithTwoTowerEncoder(_Anyio, VectorStoreIntegrationTests):
    """twotower's own encoder (embedding=None): the tiny test BERT, in fp32."""

    @pytest.fixture
    def vectorstore(self, tiny_bert_dir):
        store = TwoTowerVectorStore(encoder=str(tiny_bert_dir), precision="fp32", whole_documents=True)  # a temp folder
        yield store
        store.delete(delete_all=True)


class TestTwoTowerEmbeddings(_Anyio, EmbeddingsIntegrationTests):
    @pytest.fixture(autouse=True)
    def _model_dir(self, tiny_bert_dir):
        type(self).model_dir = str(tiny_bert_dir)

    @property
    def embeddings_class(self):
        return TwoTowerEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"encoder": self.model_dir, "precision": "fp32"}


# ------------------------------------------------------------------------ beyond the standard suites

import numpy as np  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_core.vectorstores.utils import maximal_marginal_relevance  # noqa: E402

import twotower as tt  # noqa: E402

TEXTS = [f"note {i} on {w}" for i, w in enumerate("tea coffee cats dogs rain sun moon bones genes stars".split())]
METAS = [{"group": i % 3, "id": i} for i in range(len(TEXTS))]
IDS = [f"n{i}" for i in range(len(TEXTS))]
FAKE = DeterministicFakeEmbedding(size=16)


def cosine_ranking(query: str, keep=lambda i: True) -> list[tuple[str, float]]:
    """The reference: the fake embedding's vectors, cosine, brute force in numpy."""
    docs = np.array(FAKE.embed_documents(TEXTS))
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    q = np.array(FAKE.embed_query(query))
    scores = docs @ (q / np.linalg.norm(q))
    return [(IDS[i], float(scores[i])) for i in np.argsort(-scores, kind="stable") if keep(i)]


@pytest.fixture
def filled(tmp_path):
    return TwoTowerVectorStore.from_texts(TEXTS, FAKE, metadatas=METAS, ids=IDS, path=tmp_path / "s")


def test_scores_and_filters_match_numpy(filled):
    for flt, keep in ((None, lambda i: True), ({"group": 1}, lambda i: METAS[i]["group"] == 1),
                      ({"id": {"$gte": 7}}, lambda i: i >= 7)):
        got = filled.similarity_search_with_score("warm drinks", k=3, filter=flt, mode="dense")
        want = cosine_ranking("warm drinks", keep)[:3]
        assert [d.id for d, _ in got] == [i for i, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
        for d, score in got:  # the best passage of a one-passage document: its text, its place and score beside
            i = IDS.index(d.id)
            assert d.page_content == TEXTS[i]
            assert d.metadata == {**METAS[i], "passage": {"document_id": d.id, "title": "", "start": 0,
                                                          "end": len(TEXTS[i]), "score": score, "passage_score": None}}
    with pytest.raises(tt.TwoTowerError, match="semantic"):  # Index.search's options reach it, per call
        filled.similarity_search("warm drinks", k=2, mode="semantic")
    rel = filled.similarity_search_with_relevance_scores("warm drinks", k=3, mode="dense")
    assert all(0.0 <= s <= 1.0 for _, s in rel)
    by_vector = filled.similarity_search_by_vector(FAKE.embed_query("warm drinks"), k=3)
    assert [d.id for d in by_vector] == [i for i, _ in cosine_ranking("warm drinks")[:3]]


def test_mmr_matches_langchains_own_selection(filled):
    q = FAKE.embed_query("animals")
    fetched = [i for i, _ in cosine_ranking("animals")[:6]]
    vecs = np.array(FAKE.embed_documents([TEXTS[IDS.index(i)] for i in fetched]))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    want = [fetched[j] for j in maximal_marginal_relevance(np.array(q) / np.linalg.norm(q), vecs, lambda_mult=0.3,
                                                           k=3)]
    got = filled.max_marginal_relevance_search("animals", k=3, fetch_k=6, lambda_mult=0.3)
    assert [d.id for d in got] == want
    assert [d.id for d in filled.max_marginal_relevance_search("animals", k=3, fetch_k=6, lambda_mult=1.0)] == \
        fetched[:3]  # relevance alone: the nearest


def test_reopen_retriever_and_emptying(filled, tmp_path):
    again = TwoTowerVectorStore(tmp_path / "s", embedding=FAKE)
    assert [d.id for d in again.get_by_ids(["n3", "nope", "n1"])] == ["n3", "n1"]
    with pytest.raises(tt.TwoTowerError, match="give it again"):
        TwoTowerVectorStore(tmp_path / "s").similarity_search("x")
    retriever = again.as_retriever(search_kwargs={"k": 2, "filter": {"group": 0}, "mode": "dense"})
    assert [d.id for d in retriever.invoke("rain")] == [i for i, _ in cosine_ranking(
        "rain", lambda i: METAS[i]["group"] == 0)[:2]]
    with pytest.raises(tt.TwoTowerError, match="delete_all=True"):
        again.delete()  # no ids: refused, not "everything" (issue #70)
    assert len(again.get_by_ids(IDS)) == len(IDS)
    assert again.delete(delete_all=True) is True
    assert again.similarity_search("x") == [] and again.index is None and not (tmp_path / "s").exists()
    again.add_documents([Document(page_content="back again", metadata={"id": "z"}, id="z")])
    assert again.get_by_ids(["z"]) == [Document(page_content="back again", metadata={"id": "z"}, id="z")]


def test_unknown_options_and_wrong_embeddings_are_named(tmp_path):
    with pytest.raises(tt.TwoTowerError, match="unknown bm_25"):
        TwoTowerVectorStore(bm_25=True)
    with pytest.raises(tt.TwoTowerError, match="a LangChain Embeddings"):
        TwoTowerVectorStore(embedding=lambda texts: texts)


def test_a_milvus_backed_store(tmp_path, monkeypatch):
    pytest.importorskip("milvus_lite", reason="Milvus Lite (pip install milvus-lite) is not installed")
    from pymilvus import MilvusClient

    store = TwoTowerVectorStore.from_texts(TEXTS, FAKE, metadatas=METAS, ids=IDS, path=tmp_path / "m",
                                           backend="milvus", uri=str(tmp_path / "m.db"), collection="lc")
    got = store.similarity_search_with_score("warm drinks", k=3, filter={"group": 2})
    want = cosine_ranking("warm drinks", lambda i: METAS[i]["group"] == 2)[:3]
    assert [d.id for d, _ in got] == [i for i, _ in want]
    store.delete(["n2", "missing"])
    store.add_texts(["replaced"], [{"id": 99}], ids=["n5"])
    assert store.get_by_ids(["n2", "n5"]) == [Document(page_content="replaced", metadata={"id": 99}, id="n5")]
    queries = []  # issue #54: reads by id in batched queries, not one or two per id
    real = MilvusClient.query
    monkeypatch.setattr(MilvusClient, "query", lambda self, *a, **k: queries.append(1) or real(self, *a, **k))
    asked = IDS + [f"missing{i}" for i in range(30)] + ["n0"]
    assert [d.id for d in store.get_by_ids(asked)] == [i for i in IDS if i != "n2"] + ["n0"]
    assert len(queries) <= 4  # the committed state's check, the ids, the documents (was 48: one or two per id)
    queries.clear()
    store.delete([f"missing{i}" for i in range(30)])  # unknown ids: no error, nothing written
    assert len(queries) <= 2


def test_ids_are_strings_on_every_path(filled):
    """Issue #71 item 7: ids [5, 6] were stored as "5" and "6" while add_texts returned [5, 6], so get_by_ids with
    the returned ids found nothing and delete removed nothing yet returned True. Ids are strings: another type is
    refused by name, on every path, and nothing is written."""
    for call in (lambda: filled.add_texts(["x", "y"], ids=[5, 6]),
                 lambda: filled.add_documents([Document(page_content="x")], ids=[5]),
                 lambda: filled.add_texts(["x"], ids=[b"5"]),
                 lambda: filled.get_by_ids([5]),
                 lambda: filled.delete([5]),
                 lambda: filled.delete(["n1", 2.0])):
        with pytest.raises(tt.TwoTowerError, match="ids are strings; id [01] is (int|bytes|float)"):
            call()
    with pytest.raises(tt.TwoTowerError, match="not one string"):
        filled.delete("n1")
    assert [d.id for d in filled.get_by_ids(IDS)] == IDS  # nothing written, nothing removed
    assert filled.add_texts(["five"], ids=["5"]) == ["5"]
    assert [d.page_content for d in filled.get_by_ids(["5"])] == ["five"]
    # LangChain's Document turns a numeric id into its text itself: that id is the one stored and found
    assert filled.add_documents([Document(page_content="six", id=6)]) == ["6"]
    assert [d.page_content for d in filled.get_by_ids(["6"])] == ["six"]


def test_delete_says_whether_it_removed_anything(filled):
    """LangChain's contract: True when the deletion happened, False otherwise; ids not in the store are skipped."""
    assert filled.delete(["missing"]) is False
    assert filled.delete([]) is False
    assert filled.delete(["n1", "missing"]) is True
    assert filled.delete(["n1"]) is False  # already gone
    assert [d.id for d in filled.get_by_ids(IDS)] == [i for i in IDS if i != "n1"]
    with pytest.raises(tt.TwoTowerError, match="ids or delete_all=True, not both"):
        filled.delete(["n2"], delete_all=True)
    with pytest.raises(tt.TwoTowerError, match="delete_all is True or False"):
        filled.delete(delete_all="yes")
    with pytest.raises(tt.TwoTowerError, match="delete_all=True"):
        filled.delete(None)
    with pytest.raises(tt.TwoTowerError, match="delete_all=True"):
        import asyncio

        asyncio.run(filled.adelete())
    assert len(filled.get_by_ids(IDS)) == len(IDS) - 1
    assert filled.delete(delete_all=True) is True and filled.index is None
    assert filled.delete(delete_all=True) is False  # already empty


@pytest.mark.parametrize("first_write", [True, False], ids=["building", "adding"])
def test_one_id_twice_in_a_call_keeps_the_last_text(tmp_path, first_write):
    """Issue #71 item 15: one document, the last text and metadata, whether the call builds the index or adds to
    it; the ids come back as given, one per text."""
    store = TwoTowerVectorStore(tmp_path / "s", FAKE, whole_documents=True)
    if not first_write:
        store.add_texts(["other"], ids=["o"])
    got = store.add_texts(["first", "middle", "last"], [{"v": 1}, {"v": 2}, {"v": 3}], ids=["d", "x", "d"])
    assert got == ["d", "x", "d"]
    assert store.get_by_ids(["d"]) == [Document(page_content="last", metadata={"v": 3}, id="d")]
    assert len(store.index) == 2 + (not first_write)
    hits = store.similarity_search("last", k=5)
    assert [d.id for d in hits].count("d") == 1
    assert next(d for d in hits if d.id == "d").page_content == "last"
    assert store.add_documents([Document(page_content="a", id="d"), Document(page_content="b", id="d")]) == ["d", "d"]
    assert [d.page_content for d in store.get_by_ids(["d"])] == ["b"]
    np.testing.assert_allclose(store.index.store.doc_vectors(store.index.store.row_of["d"])[0],
                               np.array(FAKE.embed_query("b")) / np.linalg.norm(FAKE.embed_query("b")), atol=1e-5)
