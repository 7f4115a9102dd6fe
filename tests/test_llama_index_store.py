"""The LlamaIndex vector store and embedding (issue #53 item 5).

llama-index-core ships no standard vector-store suite (langchain-tests does; the installed llama_index package
holds no tests). The conventions below are those of LlamaIndex's own tests of its reference store,
``SimpleVectorStore`` (llama-index-core/tests/vector_stores/test_simple.py in the llama_index repository), run here
against :class:`TwoTowerVectorStore` with the same nodes and expectations: a query without filters returns every
node by similarity; ``MetadataFilters`` (EQ, NE, GT, GTE, LT, LTE, IN, NIN; AND / OR) select exactly the matching
nodes, and within them the top k; ``node_ids`` restrict a query; a contradictory filter or one on an unknown field
matches nothing; ``delete(ref_doc_id)`` removes a source document's nodes. Operators twotower has no exact
counterpart for (NOT, CONTAINS, TEXT_MATCH, ANY, ALL) are refused with their name rather than approximated. Then
what the store adds: ``get_nodes`` / ``delete_nodes`` / ``clear``, nodes coming back whole, reopening, and
``VectorStoreIndex`` end to end with :class:`TwoTowerEmbedding`, against numpy on the same embedding."""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.schema import MetadataMode, NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (ExactMatchFilter, FilterCondition, FilterOperator, MetadataFilter,
                                                  MetadataFilters, VectorStoreQuery, VectorStoreQueryMode)

import twotower as tt
from twotower.integrations.llama_index import TwoTowerEmbedding, TwoTowerVectorStore

A, B, C = "AF3BE6C4-5F43-4D74-B075-6B0E07900DE8", "7D9CD555-846C-445C-A9DD-F8924A01411D", \
    "452D24AB-F185-414C-A352-590B4B9EE51B"


def nodes() -> list[TextNode]:
    """SimpleVectorStore's test nodes (weights 1, 2, 3; ranks a, c, c), each from its own source document."""
    rows = [(A, [1.0, 0.0], 1.0, "a"), (B, [0.0, 1.0], 2.0, "c"), (C, [1.0, 1.0], 3.0, "c")]
    return [TextNode(text="lorem ipsum", id_=i, embedding=e,
                     relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"test-{n}")},
                     metadata={"weight": w, "rank": r}) for n, (i, e, w, r) in enumerate(rows)]


@pytest.fixture
def store():
    s = TwoTowerVectorStore()
    s.add(nodes())
    return s


def ids(store, filters=None, k=3, **query):
    return store.query(VectorStoreQuery(query_embedding=[1.0, 1.0], similarity_top_k=k, filters=filters,
                                        **query)).ids


def f(*filters, condition=None):
    return MetadataFilters(filters=list(filters), **({"condition": condition} if condition else {}))


def test_query_without_filters_returns_all_rows_sorted_by_similarity(store):
    assert ids(store)[0] == C and sorted(ids(store)) == sorted([A, B, C])


def test_filters_as_simple_vector_store_tests_them(store):
    rank_c = ExactMatchFilter(key="rank", value="c")
    assert ids(store, f(rank_c)) == [C, B]
    assert ids(store, f(rank_c), k=1) == [C]
    assert ids(store, f(rank_c), node_ids=[C]) == [C]
    assert ids(store, f(rank_c, ExactMatchFilter(key="weight", value=2.0))) == [B]
    assert ids(store, f(ExactMatchFilter(key="weight", value=2), ExactMatchFilter(key="weight", value=3))) == []
    assert ids(store, f(ExactMatchFilter(key="unknown_field", value="c"))) == []
    assert len(ids(store, f(rank_c, ExactMatchFilter(key="weight", value=1.0), condition=FilterCondition.OR))) == 3
    assert ids(store, f(rank_c, ExactMatchFilter(key="weight", value=1.0), condition=FilterCondition.AND)) == []
    for op, value, count in ((FilterOperator.EQ, 1.0, 1), (FilterOperator.NE, 1.0, 2), (FilterOperator.GT, 1.5, 2),
                             (FilterOperator.GTE, 1.0, 3), (FilterOperator.LT, 1.1, 1), (FilterOperator.LTE, 1.0, 1)):
        assert len(ids(store, f(MetadataFilter(key="weight", operator=op, value=value)))) == count, op
    assert len(ids(store, f(MetadataFilter(key="rank", operator=FilterOperator.IN, value=["a", "c"])))) == 3
    assert len(ids(store, f(MetadataFilter(key="rank", operator=FilterOperator.NIN, value=["c"])))) == 1
    assert ids(store, doc_ids=["test-0", "test-2"]) == [C, A]


def test_operators_without_a_counterpart_are_named(store):
    with pytest.raises(tt.TwoTowerError, match="CONTAINS"):
        ids(store, f(MetadataFilter(key="rank", operator=FilterOperator.CONTAINS, value="c")))
    with pytest.raises(tt.TwoTowerError, match="NOT"):
        ids(store, f(ExactMatchFilter(key="rank", value="a"), condition=FilterCondition.NOT))


def test_delete_removes_document_from_query_results(store):
    store.delete("test-1")
    assert ids(store, k=2) == [C, A]
    store.delete("no-such-document")


def test_get_delete_clear_and_nodes_come_back_whole(store, tmp_path):
    got = store.get_nodes([B, A])
    expected = {n.node_id: n for n in nodes()}
    assert [n.node_id for n in got] == [B, A]
    for n in got:  # text, metadata, relationships (ref_doc_id): all but the embedding
        assert n == TextNode(**{**expected[n.node_id].model_dump(), "embedding": None})
        assert n.ref_doc_id == expected[n.node_id].ref_doc_id
    assert [n.node_id for n in store.get_nodes(filters=f(ExactMatchFilter(key="rank", value="c")))] == [B, C]
    store.delete_nodes([A, B], filters=f(ExactMatchFilter(key="rank", value="c")))
    assert sorted(n.node_id for n in store.get_nodes()) == sorted([A, C])
    store.delete_nodes([A, "missing"])
    assert [n.node_id for n in store.get_nodes()] == [C]
    store.clear()
    assert store.get_nodes() == [] and ids(store) == [] and store.client is None
    store.add(nodes()[:1])
    assert ids(store) == [A]


def test_reopen_and_text_queries(tmp_path):
    s = TwoTowerVectorStore(tmp_path / "li", bm25=True)
    s.add(nodes())
    again = TwoTowerVectorStore(tmp_path / "li")
    assert ids(again) == ids(s)
    text = VectorStoreQuery(query_str="lorem", similarity_top_k=3, mode=VectorStoreQueryMode.TEXT_SEARCH)
    assert sorted(again.query(text).ids) == sorted([A, B, C])
    with pytest.raises(tt.TwoTowerError, match="query_embedding"):
        again.query(VectorStoreQuery(query_str="lorem", similarity_top_k=1))
    with pytest.raises(tt.TwoTowerError, match="has no embedding"):
        again.add([TextNode(text="no vector", id_="x")])


def test_vector_store_index_end_to_end_with_twotower_embedding(tiny_bert_dir, tmp_path):
    from llama_index.core import StorageContext, VectorStoreIndex

    texts = ["Green tea is steamed.", "Coffee is roasted.", "Cats purr.", "Dogs bark.", "Rain falls."]
    emb = TwoTowerEmbedding(str(tiny_bert_dir), precision="fp32")
    nodes_ = [TextNode(id_=f"d{i}", text=t, metadata={"id": i, "text": "meta"}) for i, t in enumerate(texts)]
    store = TwoTowerVectorStore(tmp_path / "e2e", embedding=emb)
    index = VectorStoreIndex(nodes_, storage_context=StorageContext.from_defaults(vector_store=store),
                             embed_model=emb)
    q = "a hot drink"
    found = index.as_retriever(similarity_top_k=3).retrieve(q)
    docs = np.array(emb.get_text_embedding_batch([n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes_]))
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    qv = np.array(emb.get_query_embedding(q))
    scores = docs @ (qv / np.linalg.norm(qv))
    want = np.argsort(-scores, kind="stable")[:3]
    assert [n.node.node_id for n in found] == [f"d{i}" for i in want]
    np.testing.assert_allclose([n.score for n in found], scores[want], atol=1e-4)
    assert all(n.node.metadata == {"id": int(n.node.node_id[1:]), "text": "meta"} for n in found)
    # the query and document towers: TwoTowerEmbedding is twotower's encoder, prompts and all
    enc = tt.Encoder.load(str(tiny_bert_dir), precision="fp32")
    np.testing.assert_allclose(qv, enc.encode_queries([q])[0], atol=1e-5)
    # reopened with its embedding: text queries through it
    again = TwoTowerVectorStore(tmp_path / "e2e", embedding=emb)
    assert again.query(VectorStoreQuery(query_str=q, similarity_top_k=3)).ids == [f"d{i}" for i in want]
