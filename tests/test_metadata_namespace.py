"""Metadata is its own namespace (issue #53 item 2, #55 item 5): keys that name a document's own fields elsewhere
(``id``, ``_id``, ``text``, ``title``, ``score``) are kept exactly as given on every surface — Python
(``metadatas=``, ``Document`` objects, build and add), HTTP, the command line, Milvus, LangChain and LlamaIndex —
and never move the document's id, text or title. Only the flat form refuses them, naming the key. Each test
compares against the metadata as given (types included: ``True`` is not ``1``)."""

from __future__ import annotations

import json

import pytest

import twotower as tt
from twotower.api.dataset import as_documents

# every key a document's own field or a hit's field is called somewhere, with values of distinct JSON types
HOSTILE = {"id": 7, "_id": "elsewhere", "text": "fake text", "title": "fake title", "score": 0.5, "flag": True,
           "nested": {"id": "n", "text": [1, 2.5, None]}}
TEXTS = ["Green tea leaves are steamed soon after picking.", "Coffee beans are roasted at high heat.",
         "Cats purr when they are content."]


def same(a, b) -> bool:
    """Equal with the same types all the way down (True is not 1, 1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_same_compares_types():
    assert same(HOSTILE, json.loads(json.dumps(HOSTILE)))
    assert not same({"flag": True}, {"flag": 1}) and not same({"x": 1}, {"x": 1.0})


def check_hits(index, ids_texts: dict, metas: dict) -> None:
    for doc_id, text in ids_texts.items():
        hit = index.search(text, k=len(index), filter={"id": metas[doc_id]["id"]})[0] \
            if "id" in metas[doc_id] else index.search(text, k=len(index))[0]
        assert (hit.id, hit.text, hit.title) == (doc_id, text, "") and same(hit.metadata, metas[doc_id])


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    """An index from metadatas= holding every hostile key on one document."""
    metas = [HOSTILE, {"id": 8, "title": "x"}, None]
    index = tt.Index.build(tmp_path_factory.mktemp("ns") / "idx", TEXTS, ids=["a", "b", "c"], metadatas=metas,
                           encoder=str(tiny_bert_dir), precision="fp32", bm25=True, show_progress=False)
    return index


def test_metadatas_keep_every_key_on_build(built):
    check_hits(built, dict(zip("abc", TEXTS)), {"a": HOSTILE, "b": {"id": 8, "title": "x"}, "c": {}})
    assert [h.id for h in built.search("tea", k=3, filter={"text": "fake text"})] == ["a"]
    assert [h.id for h in built.search("tea", k=3, filter={"_id": "elsewhere"})] == ["a"]
    assert [h.id for h in built.search("tea", k=3, mode="bm25", filter={"score": {"$gt": 0.1}})] == ["a"]


def test_documents_with_hostile_metadata_keep_their_own_fields(tiny_bert_dir, tmp_path):
    """#55 item 5: Document("d1", "T", "real", {"text": "fake"}) stored the text "fake"; a metadata _id moved the
    document, a metadata title replaced the title. In build and in add, in a list and in a mapping."""
    first = tt.Document("d1", "T", "real text", {"text": "fake", "_id": "d9", "title": "other", "id": "d8"})
    index = tt.Index.build(tmp_path / "idx", [first], encoder=str(tiny_bert_dir), show_progress=False)
    index.add({"d2": tt.Document("d2", "T2", "second real", {"title": "no", "text": "no"})})
    index.add([tt.Document("d3", "", "third real", dict(HOSTILE))])
    assert sorted(index.store.doc_ids) == ["d1", "d2", "d3"]
    for doc_id, (title, text, meta) in {"d1": ("T", "real text", first.metadata),
                                         "d2": ("T2", "second real", {"title": "no", "text": "no"}),
                                         "d3": ("", "third real", HOSTILE)}.items():
        doc = index.store.document(index.store.row_of[doc_id])
        assert (doc["_id"], doc["title"], doc["text"]) == (doc_id, title, text) and same(doc["metadata"], meta)
    reopened = tt.Index.open(tmp_path / "idx")
    hit = reopened.search("third real", k=1, filter={"flag": True})[0]
    assert hit.id == "d3" and same(hit.metadata, HOSTILE)


def test_a_mapping_of_documents_refuses_a_mismatched_id():
    with pytest.raises(tt.DataError, match="id 'idY' is not its key 'keyX'"):
        as_documents({"keyX": tt.Document("idY", "", "text")})


def test_the_flat_form_refuses_a_clash_naming_the_key(built, tmp_path):
    with pytest.raises(tt.DataError) as err:
        built.search("tea", k=1, filter={"id": 7})[0].document
    assert err.value.field == "_id" and "clashes" in str(err.value)  # the first of _id, id, title, text it holds
    with pytest.raises(tt.DataError) as err:
        built.documents(["b"])  # {"id": 8, "title": "x"}
    assert err.value.field == "id" and "document 'b'" in str(err.value)
    assert built.documents(["c"]) == [{"_id": "c", "title": "", "text": TEXTS[2]}]  # no clash: the flat form
    with pytest.raises(tt.DataError, match="both _id 'a' and id 'b'"):
        as_documents([{"_id": "a", "id": "b", "text": "x"}])
    ds = tt.Dataset.from_lists([tt.Document("d1", "", "x", {"text": "y"})], {"q": "x"}, {"q": {"d1": 1}})
    with pytest.raises(tt.DataError) as err:
        ds.save(tmp_path / "saved")
    assert err.value.field == "text" and not (tmp_path / "saved").exists()


def test_http_keeps_metadata_exactly(served_index):
    from conftest import serve_client

    client = serve_client(served_index, api_key="k" * 32)
    body = {"documents": [{"_id": "h1", "title": "Real", "text": "Oolong tea is partly oxidised.",
                           "metadata": HOSTILE}]}
    assert client.post("/documents", json=body, headers={"X-API-Key": "k" * 32}).status_code == 200
    got = client.get("/documents/h1").json()
    assert (got["id"], got["title"], got["text"]) == ("h1", "Real", body["documents"][0]["text"])
    assert same(got["metadata"], HOSTILE)
    hits = client.post("/search", json={"query": "oolong", "k": 1, "filter": {"text": "fake text"}}).json()["hits"]
    assert [h["id"] for h in hits] == ["h1"] and same(hits[0]["metadata"], HOSTILE) and hits[0]["title"] == "Real"


def test_cli_corpus_file_keeps_score_and_refuses_a_second_id(tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    flat = {k: v for k, v in HOSTILE.items() if k not in ("id", "_id", "text", "title")}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "f1", "title": "T", "text": "Green tea is steamed.", **flat}) + "\n"
                      + json.dumps({"_id": "f2", "text": "Coffee is roasted."}) + "\n")
    res = CliRunner().invoke(app, ["index", "build", "--data", str(corpus), "--out", str(tmp_path / "idx"),
                                   "--model", str(tiny_bert_dir), "--no-progress"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["search", "green tea", "--index", str(tmp_path / "idx"), "-k", "1", "--filter",
                                   json.dumps({"score": 0.5}), "--json"])
    hit = json.loads(res.output.splitlines()[0])
    assert hit["id"] == "f1" and same(hit["metadata"], flat)
    corpus.write_text(json.dumps({"_id": "f3", "text": "x", "id": "f4"}) + "\n")
    res = CliRunner().invoke(app, ["index", "add", "--index", str(tmp_path / "idx"), "--docs", str(corpus)])
    assert res.exit_code == 2 and "'id'" in res.output and "Traceback" not in res.output


def test_milvus_keeps_metadata_exactly(tiny_bert_dir, tmp_path):
    pytest.importorskip("milvus_lite", reason="Milvus Lite (pip install milvus-lite) is not installed")
    index = tt.Index.build(tmp_path / "mil", [tt.Document("m1", "T", TEXTS[0], HOSTILE),
                                              tt.Document("m2", "", TEXTS[1], {"text": "other"})],
                           encoder=str(tiny_bert_dir), show_progress=False, backend="milvus",
                           uri=str(tmp_path / "m.db"), collection="ns")
    hits = index.search("tea", k=2, filter={"text": "fake text"})
    assert [h.id for h in hits] == ["m1"] and same(hits[0].metadata, HOSTILE) and hits[0].text == TEXTS[0]
    index.add([tt.Document("m3", "", TEXTS[2], {"_id": "m1", "title": "t"})])
    hit = index.search("cats", k=1, filter={"_id": "m1"})[0]
    assert (hit.id, hit.title, hit.metadata) == ("m3", "", {"_id": "m1", "title": "t"})


def test_frameworks_return_metadata_exactly(built):
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from twotower.integrations.langchain import TwoTowerRetriever, TwoTowerVectorStore
    from twotower.integrations.llama_index import TwoTowerRetriever as LlamaRetriever
    from twotower.integrations.llama_index import TwoTowerVectorStore as LlamaStore

    doc = TwoTowerRetriever(built, k=1, filter={"id": 7}, whole_documents=True).invoke("tea")[0]
    assert doc.id == "a" and same(doc.metadata, HOSTILE) and doc.score == built.search("tea", k=1, filter={"id": 7})[0].score
    node = LlamaRetriever(built, k=1, filters={"id": 7}, whole_documents=True).retrieve("tea")[0]
    assert node.node.id_ == "a" and same(node.node.metadata, HOSTILE)

    from langchain_core.embeddings import DeterministicFakeEmbedding

    store = TwoTowerVectorStore(embedding=DeterministicFakeEmbedding(size=8), whole_documents=True)
    store.add_texts(["alpha", "beta"], metadatas=[HOSTILE, {"id": 1}], ids=["x", "y"])
    got = store.similarity_search("alpha", k=1)[0]
    assert (got.id, got.page_content) == ("x", "alpha") and same(got.metadata, HOSTILE)
    assert same(store.get_by_ids(["y"])[0].metadata, {"id": 1})

    lstore = LlamaStore(whole_documents=True)
    lstore.add([TextNode(id_="n1", text="alpha", metadata=dict(HOSTILE), embedding=[1.0, 0.0]),
                TextNode(id_="n2", text="beta", metadata={"text": "b"}, embedding=[0.0, 1.0])])
    result = lstore.query(VectorStoreQuery(query_embedding=[1.0, 0.1], similarity_top_k=2))
    assert result.ids == ["n1", "n2"] and same(result.nodes[0].metadata, HOSTILE)
    assert [n.text for n in result.nodes] == ["alpha", "beta"]
    assert same(lstore.get_nodes(["n2"])[0].metadata, {"text": "b"})
