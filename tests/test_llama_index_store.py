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
``VectorStoreIndex`` end to end with :class:`TwoTowerEmbedding`, against numpy on the same embedding; filters that
must never select everything by mistake (``$not`` at any depth, empty filters refused for deletes, ``delete`` with
a ref_doc_id that is not a string), ``similarity_top_k=0``, and one id twice in one ``add``."""

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
    for n in found:  # each node as its best passage (a short node: its whole text), its place beside its metadata
        i = int(n.node.node_id[1:])
        assert n.node.text == texts[i]
        assert n.node.metadata == {"id": i, "text": "meta", "passage": {
            "document_id": f"d{i}", "title": "", "start": 0, "end": len(texts[i]), "score": n.score,
            "passage_score": None}}
    # the query and document towers: TwoTowerEmbedding is twotower's encoder, prompts and all
    enc = tt.Encoder.load(str(tiny_bert_dir), precision="fp32")
    np.testing.assert_allclose(qv, enc.encode_queries([q])[0], atol=1e-5)
    # reopened with its embedding: text queries through it
    again = TwoTowerVectorStore(tmp_path / "e2e", embedding=emb)
    assert again.query(VectorStoreQuery(query_str=q, similarity_top_k=3)).ids == [f"d{i}" for i in want]


# ------------------------------------------------------------------ filters that must not select every node


KINDS = {"k1": {"kind": "a", "n": 1}, "k2": {"kind": "b", "n": 2}, "k3": {"kind": "a", "n": 3},
         "k4": {"kind": "c", "n": 4, "deep": {"kind": "a"}}}


@pytest.fixture
def kinds(tmp_path):
    s = TwoTowerVectorStore(tmp_path / "kinds")
    s.add([TextNode(id_=i, text=f"text {i}", metadata=m, embedding=[float(n), 1.0])
           for n, (i, m) in enumerate(KINDS.items())])
    return s


def _matching(pred) -> list[str]:
    """The reference: the nodes whose metadata ``pred`` accepts, evaluated in Python on KINDS."""
    return [i for i, m in KINDS.items() if pred(m)]


NOT_FILTERS = [  # a dict filter with $not (and $not inside $and / $or / $not), and what it selects
    ({"$not": {"kind": "a"}}, lambda m: m["kind"] != "a"),
    ({"$not": {"$or": [{"kind": "a"}, {"n": {"$gte": 4}}]}}, lambda m: m["kind"] == "b"),
    ({"$and": [{"$not": {"kind": "b"}}, {"n": {"$lt": 4}}]}, lambda m: m["kind"] == "a"),
    ({"$or": [{"$not": {"n": {"$lte": 3}}}, {"kind": "b"}]}, lambda m: m["n"] in (2, 4)),
    ({"$not": {"$not": {"kind": "c"}}}, lambda m: m["kind"] == "c"),
    ({"$not": {"deep.kind": "a"}}, lambda m: m.get("deep", {}).get("kind") != "a"),
]


@pytest.mark.parametrize("flt,pred", NOT_FILTERS, ids=[str(f) for f, _ in NOT_FILTERS])
def test_not_filters_apply_to_the_node_metadata_at_any_depth(kinds, flt, pred):
    """Issue #71 item 2: the fields inside $not were not moved under the node's metadata, so $not matched every
    node: get_nodes returned all of them and delete_nodes deleted all of them, index folder included."""
    want = _matching(pred)
    assert 0 < len(want) < len(KINDS)
    assert [n.node_id for n in kinds.get_nodes(filters=flt)] == want
    q = VectorStoreQuery(query_embedding=[1.0, 1.0], similarity_top_k=len(KINDS), filters=flt)
    assert sorted(kinds.query(q).ids) == want
    kinds.delete_nodes(filters=flt)
    assert [n.node_id for n in kinds.get_nodes()] == [i for i in KINDS if i not in want]
    assert kinds.client is not None and kinds.path.exists()


def test_deletes_refuse_filters_that_select_everything(kinds):
    """An empty filter is refused for a delete, as the HTTP service refuses one (and as LangChain's delete() without
    ids is): clear() removes every node; a filter with ids still restricts them."""
    empties = [MetadataFilters(filters=[]), {}, {"$and": [{}]}, {"$or": [{}, {"kind": "a"}]},
               MetadataFilters(filters=[MetadataFilters(filters=[])])]
    for flt in empties:
        with pytest.raises(tt.TwoTowerError, match="empty filter would select every node"):
            kinds.delete_nodes(filters=flt)
        with pytest.raises(tt.TwoTowerError, match="empty filter would select every node"):
            kinds.delete_nodes(["k1"], filters=flt)
    with pytest.raises(tt.TwoTowerError, match="node_ids and/or a non-empty filter"):
        kinds.delete_nodes()
    for ref in ({"$exists": True}, None, 5, ["test-0"]):  # delete({"$exists": True}) deleted every node
        with pytest.raises(tt.TwoTowerError, match="ref_doc_id is the id of a source document"):
            kinds.delete(ref)
    assert [n.node_id for n in kinds.get_nodes()] == list(KINDS)
    # reads take an empty filter as no filter
    assert [n.node_id for n in kinds.get_nodes(filters=MetadataFilters(filters=[]))] == list(KINDS)
    assert len(kinds.query(VectorStoreQuery(query_embedding=[1.0, 1.0], similarity_top_k=9,
                                            filters=MetadataFilters(filters=[]))).ids) == len(KINDS)
    kinds.delete_nodes(["k1", "k2"], filters={"kind": "a"})  # ids and a filter: both must hold
    assert [n.node_id for n in kinds.get_nodes()] == ["k2", "k3", "k4"]
    kinds.clear()
    assert kinds.get_nodes() == []


def test_similarity_top_k_zero_finds_nothing(store):
    """Issue #71: similarity_top_k=0 returned one node."""
    for mode in (VectorStoreQueryMode.DEFAULT,):
        result = store.query(VectorStoreQuery(query_embedding=[1.0, 1.0], similarity_top_k=0, mode=mode))
        assert (result.ids, result.nodes, result.similarities) == ([], [], [])
    assert len(ids(store, k=None)) == 1  # left out: LlamaIndex's default, 1
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(tt.TwoTowerError, match="similarity_top_k"):
            ids(store, k=bad)


@pytest.mark.parametrize("first_write", [True, False], ids=["building", "adding"])
def test_one_node_id_twice_in_an_add_keeps_the_last(tmp_path, first_write):
    s = TwoTowerVectorStore(tmp_path / "twice")
    if not first_write:
        s.add([TextNode(id_="other", text="other", embedding=[0.0, 1.0])])
    got = s.add([TextNode(id_="n", text="first", metadata={"v": 1}, embedding=[1.0, 0.0]),
                 TextNode(id_="m", text="middle", embedding=[0.5, 0.5]),
                 TextNode(id_="n", text="last", metadata={"v": 3}, embedding=[0.6, 0.8])])
    assert got == ["n", "m", "n"]
    [node] = s.get_nodes(["n"])
    assert (node.text, node.metadata) == ("last", {"v": 3})
    assert len(s.client) == 2 + (not first_write)
    result = s.query(VectorStoreQuery(query_embedding=[0.6, 0.8], similarity_top_k=5))
    assert result.ids.count("n") == 1 and result.ids[0] == "n"
    assert result.similarities[0] == pytest.approx(1.0, abs=1e-5)  # the last vector: [0.6, 0.8]
