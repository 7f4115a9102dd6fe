"""``POST /documents`` over its limits (issue #53): a batch with one document over a limit is refused whole (nothing
is written), and the message names that document, by its place in the batch and its id (or, for a plain string,
its length), once, in the form the document has (pydantic answers for both forms a document may take)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from twotower.data.ids import MAX_TEXT_CHARS

KEY = "limits-key-0123456789"
OVER = MAX_TEXT_CHARS + 1
HEADERS = {"X-API-Key": KEY}


@pytest.fixture()
def client(served_index):
    from conftest import serve_client

    return serve_client(served_index, KEY)


def refused(client, documents) -> list[dict]:
    before = client.get("/healthz").json()
    r = client.post("/documents", json={"documents": documents}, headers=HEADERS)
    assert r.status_code == 422 and r.json()["error"] == "invalid_request", r.text
    assert client.get("/healthz").json() == before  # nothing written
    return r.json()["detail"]


def test_one_over_long_field_names_its_document(client):
    ok = {"_id": "fine", "text": "A document within every limit."}
    detail = refused(client, [ok, {"_id": "huge", "title": "T", "text": "x" * OVER}, ok | {"_id": "fine2"}])
    too_long = (f"Value error, the text is {OVER:,} characters long, over the limit of {MAX_TEXT_CHARS:,} for one text: "
                "split it into several documents")  # the limit Python's documents have too (data.ids.text_problem)
    assert detail == [{"loc": ["body", "documents", 1, "text"], "type": "value_error",
                       "msg": f"documents[1] (id 'huge'): text: {too_long}"}]

    detail = refused(client, [ok, "y" * OVER])  # a plain string: its place and its length
    assert detail == [{"loc": ["body", "documents", 1], "type": "value_error",
                       "msg": f"documents[1] (a plain string of {OVER:,} characters): {too_long}"}]

    detail = refused(client, [{"id": "t", "title": "t" * 2049, "text": "ok"}])  # "id" as well as "_id"
    assert [d["msg"] for d in detail] == ["documents[0] (id 't'): title: String should have at most 2048 characters"]


def test_each_document_over_a_limit_is_named_once(client):
    detail = refused(client, [{"_id": "a", "text": "x" * OVER}, 7, {"_id": "b", "text": "ok", "extra": 1},
                              {"title": "no id", "text": "ok"}])
    msgs = [d["msg"] for d in detail]
    assert msgs[0].startswith(f"documents[0] (id 'a'): text: Value error, the text is {OVER:,} characters long")
    assert msgs[1] == ('documents[1]: a document is an object {"_id", "title", "text", "metadata"} or a string, '
                       "not a number")
    assert msgs[2].startswith("documents[2] (id 'b'): extra: Extra inputs are not permitted")
    assert msgs[3].startswith("documents[3]: _id: Field required")
    assert [d["loc"][:3] for d in detail] == [["body", "documents", i] for i in range(4)]


def test_metadata_over_its_limit_names_the_document_and_its_id(client):
    r = client.post("/documents", json={"documents": [{"_id": "m1", "text": "ok", "metadata": {"k": "v" * 70_000}}]},
                    headers=HEADERS)
    assert r.status_code == 422 and "documents[0] (id 'm1')" in str(r.json()["detail"]), r.text


def test_other_requests_keep_their_messages(client):
    r = client.post("/search", json={"query": "q" * 2049})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "query"]
    assert r.json()["detail"][0]["msg"] == "String should have at most 2048 characters"
