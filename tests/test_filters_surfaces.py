"""Metadata and filters on every surface (#43): the LangChain and LlamaIndex retrievers, the HTTP service and the
command line, each end to end on a real index. The reference is hand-computed: which documents a filter lets
through is written out below by reading the corpus, and a surface's answer must be exactly Index.search's with the
same filter (itself tested against brute force in tests/test_filters.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.documents import Document
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

import twotower as tt
from twotower.integrations.langchain import TwoTowerRetriever as LangChainRetriever
from twotower.integrations.llama_index import TwoTowerRetriever as LlamaRetriever
from twotower.integrations.llama_index import to_twotower_filter

DOCS = [
    {"_id": "tea1", "title": "Green tea", "text": "Green tea leaves are steamed or pan-fired soon after picking.",
     "topic": "tea", "year": 2019, "tags": ["drink", "green"], "src": {"kind": "wiki", "rank": 1}},
    {"_id": "tea2", "title": "Black tea", "text": "Black tea is fully oxidised before the leaves are dried.",
     "topic": "tea", "year": 2021, "tags": ["drink"], "src": {"kind": "book", "rank": 2}},
    {"_id": "tea3", "text": "Oolong tea is partly oxidised, between green and black tea.",
     "topic": "tea", "year": 2023, "draft": True},
    {"_id": "cof1", "title": "Coffee roasting", "text": "Coffee beans are roasted at about two hundred degrees.",
     "topic": "coffee", "year": 2020, "tags": ["drink", "roast"], "src": {"kind": "wiki", "rank": 3}},
    {"_id": "cof2", "title": "Espresso", "text": "Espresso forces hot water through finely ground coffee.",
     "topic": "coffee", "year": 2022},
    {"_id": "cat1", "title": "Cats", "text": "Cats purr when they are content and sometimes when they are hurt.",
     "topic": "animal", "year": 2018, "src": {"kind": "book", "rank": 4}},
    {"_id": "dog1", "title": "Dogs", "text": "Dogs were domesticated from wolves long ago.", "topic": "animal",
     "year": "unknown"},
    {"_id": "sun1", "title": "The Sun", "text": "The sun is a star fusing hydrogen into helium.", "year": 2024},
]
IDS = [d["_id"] for d in DOCS]
# filter → the documents it lets through, read off DOCS by hand
CASES = [
    ({"topic": "tea"}, {"tea1", "tea2", "tea3"}),
    ({"topic": {"$ne": "tea"}}, {"cof1", "cof2", "cat1", "dog1"}),  # $ne needs the field: sun1 has no topic
    ({"year": {"$gte": 2021}}, {"tea2", "tea3", "cof2", "sun1"}),  # dog1's year is a string: no match
    ({"year": {"$gt": 2018, "$lt": 2021}}, {"tea1", "cof1"}),
    ({"topic": {"$in": ["coffee", "animal"]}}, {"cof1", "cof2", "cat1", "dog1"}),
    ({"topic": {"$nin": ["coffee", "animal"]}}, {"tea1", "tea2", "tea3"}),
    ({"tags": "drink"}, {"tea1", "tea2", "cof1"}),
    ({"src.kind": "wiki"}, {"tea1", "cof1"}),
    ({"src.rank": {"$lte": 2}}, {"tea1", "tea2"}),
    ({"draft": {"$exists": True}}, {"tea3"}),
    ({"$or": [{"topic": "coffee"}, {"year": {"$lt": 2019}}]}, {"cof1", "cof2", "cat1"}),
    ({"$and": [{"topic": "tea"}, {"$or": [{"src.kind": "book"}, {"draft": True}]}]}, {"tea2", "tea3"}),
    ({"topic": "nothing"}, set()),
    ({"no_such_field": 1}, set()),
]
QUERIES = ["how is tea made", "roasted coffee", "animals that purr"]
FILTER_IDS = [json.dumps(f) for f, _ in CASES]


@pytest.fixture(scope="module")
def index(tiny_bert_dir, tmp_path_factory) -> tt.Index:
    return tt.Index.build(tmp_path_factory.mktemp("surfaces") / "idx", DOCS, encoder=str(tiny_bert_dir), bm25=True,
                          precision="fp32", show_progress=False)


def metadata_of(doc_id: str) -> dict:
    doc = next(d for d in DOCS if d["_id"] == doc_id)
    return {k: v for k, v in doc.items() if k not in ("_id", "title", "text")}


def test_the_hand_written_expectations_agree_with_the_filter_module():
    """The table above is the reference; a second reading of it through Filter.matches guards typos in it."""
    for flt, expected in CASES:
        assert {d for d in IDS if tt.parse_filter(flt).matches(metadata_of(d))} == expected, flt


# ------------------------------------------------------------------------------------------------- LangChain


@pytest.mark.parametrize(("flt", "expected"), CASES, ids=FILTER_IDS)
def test_langchain_filter_gives_exactly_the_matching_documents(index, flt, expected):
    by_field = LangChainRetriever(index, k=len(IDS), filter=flt)
    by_kwargs = LangChainRetriever(index, k=len(IDS), search_kwargs={"filter": flt})
    per_call = LangChainRetriever(index, k=2)
    for q in QUERIES:
        hits = index.search(q, k=len(IDS), filter=flt)
        assert {h.id for h in hits} == expected  # every matching document: k exceeds their number
        for docs in (by_field.invoke(q), by_kwargs.invoke(q), per_call.invoke(q, k=len(IDS), filter=flt),
                     asyncio.run(per_call.ainvoke(q, k=len(IDS), filter=flt))):
            assert [d.id for d in docs] == [h.id for h in hits]
            assert [d.score for d in docs] == [h.score for h in hits]


def test_langchain_metadata_is_the_documents_metadata_exactly(index):
    docs = LangChainRetriever(index, k=len(IDS), whole_documents=True).invoke("tea")
    assert len(docs) == len(IDS)
    for d in docs:  # nothing added: the id and the score have fields of their own
        assert d.metadata == metadata_of(d.id)
        assert d.page_content.startswith(next(x.get("title", "") for x in DOCS if x["_id"] == d.id))


def test_langchain_invoke_k_and_options_per_call(index):
    retriever = LangChainRetriever(index, k=5, search_kwargs={"filter": {"topic": "tea"}})
    assert len(retriever.invoke("tea")) == 3  # the filter holds: three teas
    assert [d.id for d in retriever.invoke("tea", k=1)] == [h.id for h in index.search("tea", 1, filter={"topic": "tea"})]
    assert len(retriever.invoke("tea", filter=None)) == 5  # a filter per call replaces the retriever's
    bm25 = retriever.invoke("roasted coffee", mode="bm25", filter={"topic": "coffee"})
    assert [d.id for d in bm25] == [h.id for h in index.search("roasted coffee", 5, mode="bm25",
                                                                filter={"topic": "coffee"})]
    assert retriever.invoke("tea", k=2)[0].metadata["topic"] == "tea"
    assert LangChainRetriever(index, search_kwargs={"k": 4}).k == 4


@pytest.mark.parametrize(("make", "named"), [
    (lambda ix: LangChainRetriever(ix, filter={"year": {"$gtx": 1}}), "$gtx"),
    (lambda ix: LangChainRetriever(ix, search_kwargs={"filter": {"topic": {"$in": "tea"}}}), "$in"),
    (lambda ix: LangChainRetriever(ix, search_kwargs={"fliter": {}}), "fliter"),
    (lambda ix: LangChainRetriever(ix, search_kwargs=[("k", 3)]), "search_kwargs"),
    (lambda ix: LangChainRetriever(ix, k=3, search_kwargs={"k": 4}), "search_kwargs"),
    (lambda ix: LangChainRetriever(ix).invoke("tea", top_k=3), "top_k"),
    (lambda ix: LangChainRetriever(ix).invoke("tea", k=0), "k"),
    (lambda ix: LangChainRetriever(ix).invoke("tea", filter={"$or": {}}), "$or"),
    (lambda ix: LangChainRetriever(ix).invoke("tea", mode="dense", lam=0.5), "lam"),  # lam outside hybrid
])
def test_langchain_bad_filters_and_options_are_named(index, make, named):
    with pytest.raises(tt.TwoTowerError, match=named.replace("$", r"\$")):
        make(index)


# ------------------------------------------------------------------------------------------------ LlamaIndex


def _eq(key, value, op=FilterOperator.EQ):
    return MetadataFilter(key=key, value=value, operator=op)


LLAMA_CASES = [  # (MetadataFilters, the twotower filter it means, the documents it lets through)
    (MetadataFilters(filters=[_eq("topic", "tea")]), {"$and": [{"topic": {"$eq": "tea"}}]}, {"tea1", "tea2", "tea3"}),
    (MetadataFilters(filters=[_eq("topic", "tea", FilterOperator.NE)]), {"$and": [{"topic": {"$ne": "tea"}}]},
     {"cof1", "cof2", "cat1", "dog1"}),
    (MetadataFilters(filters=[_eq("year", 2021, FilterOperator.GT)]), {"$and": [{"year": {"$gt": 2021}}]},
     {"tea3", "cof2", "sun1"}),
    (MetadataFilters(filters=[_eq("year", 2021, FilterOperator.GTE), _eq("year", 2023, FilterOperator.LTE)]),
     {"$and": [{"year": {"$gte": 2021}}, {"year": {"$lte": 2023}}]}, {"tea2", "tea3", "cof2"}),
    (MetadataFilters(filters=[_eq("year", 2019, FilterOperator.LT)]), {"$and": [{"year": {"$lt": 2019}}]}, {"cat1"}),
    (MetadataFilters(filters=[_eq("topic", ["coffee", "animal"], FilterOperator.IN)]),
     {"$and": [{"topic": {"$in": ["coffee", "animal"]}}]}, {"cof1", "cof2", "cat1", "dog1"}),
    (MetadataFilters(filters=[_eq("topic", ["coffee", "animal"], FilterOperator.NIN)]),
     {"$and": [{"topic": {"$nin": ["coffee", "animal"]}}]}, {"tea1", "tea2", "tea3"}),
    (MetadataFilters(filters=[_eq("topic", "coffee"), _eq("src.kind", "book")], condition=FilterCondition.OR),
     {"$or": [{"topic": {"$eq": "coffee"}}, {"src.kind": {"$eq": "book"}}]}, {"cof1", "cof2", "tea2", "cat1"}),
    (MetadataFilters(filters=[_eq("topic", "tea"), MetadataFilters(
        filters=[_eq("year", 2019), _eq("year", 2023)], condition=FilterCondition.OR)]),
     {"$and": [{"topic": {"$eq": "tea"}}, {"$or": [{"year": {"$eq": 2019}}, {"year": {"$eq": 2023}}]}]},
     {"tea1", "tea3"}),
]


@pytest.mark.parametrize(("filters", "translated", "expected"), LLAMA_CASES, ids=[str(c[1]) for c in LLAMA_CASES])
def test_llama_index_metadata_filters_are_translated_and_applied(index, filters, translated, expected):
    assert to_twotower_filter(filters) == translated
    retriever = LlamaRetriever(index, k=len(IDS), filters=filters, whole_documents=True)
    for q in QUERIES:
        hits = index.search(q, k=len(IDS), filter=translated)
        assert {h.id for h in hits} == expected
        nodes = retriever.retrieve(q)
        assert [n.node.id_ for n in nodes] == [h.id for h in hits]
        assert [n.score for n in nodes] == [h.score for h in hits]
        assert [n.node.metadata for n in nodes] == [metadata_of(h.id) for h in hits]  # exactly: nothing added


def test_llama_index_takes_a_twotower_filter_dict_too(index):
    nodes = LlamaRetriever(index, k=len(IDS), filters={"tags": "drink"}).retrieve("tea")
    assert {n.node.id_ for n in nodes} == {"tea1", "tea2", "cof1"}


@pytest.mark.parametrize("op", [FilterOperator.TEXT_MATCH, FilterOperator.CONTAINS, FilterOperator.ANY,
                                FilterOperator.ALL, FilterOperator.IS_EMPTY])
def test_llama_index_unsupported_operators_are_named(index, op):
    value = ["drink"] if op in (FilterOperator.ANY, FilterOperator.ALL) else "drink"
    with pytest.raises(tt.TwoTowerError, match=f"FilterOperator.{op.name}.*'tags'"):
        LlamaRetriever(index, filters=MetadataFilters(filters=[_eq("topic", "tea"), _eq("tags", value, op)]))


def test_llama_index_not_condition_and_bad_values_are_named(index):
    with pytest.raises(tt.TwoTowerError, match="FilterCondition.NOT"):
        LlamaRetriever(index, filters=MetadataFilters(filters=[_eq("topic", "tea")], condition=FilterCondition.NOT))
    with pytest.raises(tt.TwoTowerError, match=r"\$in"):  # IN with a single value: the filter language's own check
        LlamaRetriever(index, filters=MetadataFilters(filters=[_eq("topic", "tea", FilterOperator.IN)]))
    with pytest.raises(tt.TwoTowerError, match="filters"):
        LlamaRetriever(index, filters=[("topic", "tea")])


# ---------------------------------------------------------------------------------------------- HTTP service

KEY = "test-key-0123456789"
HEADERS = {"X-API-Key": KEY}


@pytest.fixture()
def client(index, tmp_path):
    """A service over a private copy of the index (the write tests change it)."""
    import shutil

    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    shutil.copytree(index.path, tmp_path / "idx")
    return TestClient(create_app(tmp_path / "idx", api_key=KEY, precision="fp32"))


def test_service_filter_gives_exactly_the_matching_documents_with_metadata(client, index):
    for flt, expected in CASES:
        for q in QUERIES[:2]:
            body = client.post("/search", json={"query": q, "k": len(IDS), "filter": flt})
            assert body.status_code == 200, body.text
            hits = index.search(q, k=len(IDS), filter=flt)
            got = body.json()["hits"]
            assert [h["id"] for h in got] == [h.id for h in hits] and {h.id for h in hits} == expected
            assert [h["metadata"] for h in got] == [metadata_of(h.id) for h in hits]
            assert [h["score"] for h in got] == pytest.approx([h.score for h in hits], abs=1e-6)
        batch = client.post("/search/batch", json={"queries": QUERIES, "k": 2, "mode": "bm25", "filter": flt})
        assert batch.status_code == 200, batch.text
        assert [[h["id"] for h in r] for r in batch.json()["results"]] == \
            [[h.id for h in r] for r in index.search(QUERIES, k=2, mode="bm25", filter=flt)]


def test_service_documents_carry_metadata_and_strings_get_content_ids(client):
    got = client.get("/documents/tea1").json()
    assert got["metadata"] == metadata_of("tea1") and got["title"] == "Green tea"
    texts = ["Matcha is stone-ground green tea.", "Chai is spiced black tea with milk."]
    body = {"documents": [texts[0], {"id": "x1", "text": "Yerba mate is brewed from holly leaves.",
                                     "metadata": {"topic": "tea", "year": 2025, "src": {"kind": "blog"}}},
                          {"_id": "x2", "title": "Chai", "text": texts[1]}]}
    answer = client.post("/documents", json=body, headers=HEADERS)
    assert answer.status_code == 200, answer.text
    assert answer.json()["ids"] == [tt.document_id(texts[0]), "x1", "x2"]
    assert answer.json()["added"] == 3 and answer.json()["documents"] == len(IDS) + 3
    assert client.get(f"/documents/{tt.document_id(texts[0])}").json()["metadata"] == {}
    assert client.get("/documents/x1").json()["metadata"] == {"topic": "tea", "year": 2025, "src": {"kind": "blog"}}
    hits = client.post("/search", json={"query": "tea", "k": 10, "filter": {"year": {"$gte": 2024}}}).json()["hits"]
    assert {h["id"] for h in hits} == {"sun1", "x1"}
    again = client.post("/documents", json={"documents": [texts[0]], "replace": False}, headers=HEADERS)
    assert again.status_code == 409 and tt.document_id(texts[0]) in again.text  # the same text twice: detected


@pytest.mark.parametrize(("flt", "named"), [
    ({"year": {"$gtx": 1}}, "$gtx"), ({"topic": {"$in": "tea"}}, "$in"), ({"$or": []}, "$or"),
    ({"year": {"$exists": 1}}, "$exists"), ({"src..kind": 1}, "src..kind"), ({"$not": {}}, "$not"),
    ({"$nor": {"topic": "tea"}}, "$nor"),
])
def test_service_bad_filters_are_422_naming_the_operator(client, flt, named):
    for path, body in (("/search", {"query": "tea", "filter": flt}), ("/search/batch", {"queries": ["tea"],
                                                                                      "filter": flt})):
        answer = client.post(path, json=body)
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert detail[0]["loc"][-1] == "filter" and named in detail[0]["msg"], detail
    assert client.post("/search", json={"query": "tea", "filter": ["topic"]}).status_code == 422


@pytest.mark.parametrize(("metadata", "named"), [
    ({"big": "x" * (70 * 1024)}, "64 KiB"), ({"n": [1, float("nan")]}, "n[1]"),
    ({"a": {"b": 1e400}}, "a.b"),  # JSON allows 1e400 and Python reads it as inf
])
def test_service_bad_metadata_is_refused_naming_the_field_and_nothing_is_written(client, metadata, named):
    version = client.get("/healthz").json()["version"]
    body = json.dumps({"documents": [{"_id": "new", "text": "New text.", "metadata": metadata}]})
    answer = client.post("/documents", content=body, headers={**HEADERS, "Content-Type": "application/json"})
    # checked with the request (issue #55: a 422 like a filter's mistakes, never a 500), located at the document
    assert answer.status_code == 422 and named in answer.text, answer.text
    assert answer.json()["detail"][0]["loc"][:3] == ["body", "documents", 0], answer.text
    assert client.get("/healthz").json()["version"] == version
    assert client.get("/documents/new").status_code == 404


def test_service_metadata_is_its_own_namespace(client):
    """Keys that name a document's fields elsewhere (id, score, text, title) are kept as sent (issue #53)."""
    metadata = {"id": "x", "score": 1, "text": "not the text", "title": "not the title"}
    body = {"documents": [{"_id": "new", "title": "T", "text": "New text.", "metadata": metadata}]}
    assert client.post("/documents", json=body, headers=HEADERS).status_code == 200
    got = client.get("/documents/new").json()
    assert (got["title"], got["text"], got["metadata"]) == ("T", "New text.", metadata)


# ------------------------------------------------------------------------------------------------ command line


@pytest.fixture(scope="module")
def cli_index(tiny_bert_dir, tmp_path_factory):
    """An index built by `twotower index build` from a corpus file whose extra fields are the metadata."""
    from typer.testing import CliRunner

    from twotower.cli import app

    root = tmp_path_factory.mktemp("cli")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    res = CliRunner().invoke(app, ["index", "build", "--data", str(corpus), "--out", str(root / "idx"), "--model",
                                   str(tiny_bert_dir), "--bm25", "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    return root / "idx"


def cli(*args: str):
    from typer.testing import CliRunner

    from twotower.cli import app

    return CliRunner().invoke(app, list(args))


def cli_hits(res) -> list[dict]:
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in res.output.splitlines() if line.strip()]


@pytest.mark.parametrize(("flt", "expected"), CASES, ids=FILTER_IDS)
def test_cli_search_filter_with_metadata_in_json(cli_index, flt, expected, tmp_path):
    index = tt.Index.open(cli_index, precision="fp32")
    hits = index.search(QUERIES[0], k=len(IDS), filter=flt)
    assert {h.id for h in hits} == expected
    by_text = cli_hits(cli("search", QUERIES[0], "--index", str(cli_index), "-k", str(len(IDS)), "--filter",
                           json.dumps(flt), "--json"))
    (tmp_path / "f.json").write_text(json.dumps(flt))
    by_file = cli_hits(cli("search", QUERIES[0], "--index", str(cli_index), "-k", str(len(IDS)), "--filter",
                           f"@{tmp_path / 'f.json'}", "--json"))
    for got in (by_text, by_file):
        assert [h["id"] for h in got] == [h.id for h in hits]
        assert [h["metadata"] for h in got] == [metadata_of(h.id) for h in hits]  # the corpus file's extra fields
        assert [h["rank"] for h in got] == list(range(1, len(hits) + 1))


def test_cli_index_add_keeps_metadata_and_an_empty_filtered_result_says_so(cli_index, tmp_path):
    import shutil

    idx = tmp_path / "idx"
    shutil.copytree(cli_index, idx)
    docs = tmp_path / "new.jsonl"
    docs.write_text(json.dumps({"_id": "new1", "text": "Rooibos is a red bush tea.", "topic": "tisane",
                                "origin": {"country": "ZA"}}) + "\n")
    res = cli("index", "add", "--index", str(idx), "--docs", str(docs), "--precision", "fp32", "--no-progress")
    assert res.exit_code == 0, res.output
    got = cli_hits(cli("search", "tea", "--index", str(idx), "--filter", '{"origin.country": "ZA"}', "--json"))
    assert [(h["id"], h["metadata"]) for h in got] == [("new1", {"topic": "tisane", "origin": {"country": "ZA"}})]
    table = cli("search", "tea", "--index", str(idx), "--filter", '{"topic": "none"}')
    assert table.exit_code == 0 and "no document matches" in table.output and "--filter" in table.output


@pytest.mark.parametrize(("value", "named"), [
    ('{"year": {"$gtx": 1}}', "$gtx"), ('{"topic": {"$in": "tea"}}', "$in"), ("{'topic': 'tea'}", "not JSON"),
    ('["topic"]', "object"), ("@/no/such/filter.json", "/no/such/filter.json"),
])
def test_cli_bad_filters_name_the_option(cli_index, value, named):
    res = cli("search", "tea", "--index", str(cli_index), "--filter", value)
    assert res.exit_code != 0
    assert "--filter" in res.output and named in res.output and "Traceback" not in res.output, res.output
