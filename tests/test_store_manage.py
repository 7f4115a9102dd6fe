"""Store operations on a local index (issue #53, item 1), against a brute-force reference over the documents
(tests/manage_cases.py): ``$not`` and ``$text`` (the mask, ``Filter.matches`` and a filtered search), ``count``,
``list`` (pages through the cursor and by offset), ``get`` by filter and by ids, ``delete(filter=...)`` as one new
version, ``update`` of metadata only (vectors, FAISS and BM25 files byte-identical, the same search scores); and the
same operations through the command line and the HTTP service, writes there needing the key and a delete needing a
non-empty filter."""

from __future__ import annotations

import json

import numpy as np
import pytest

import twotower as tt
from _fixtures import build_small_index, private_copy
from manage_cases import FILTERS, NEW_FILTERS, corpus, expected, metadata_of, passes, walk_pages
from twotower.retrieval.filters.columns import columns_of


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    return build_small_index(tmp_path_factory.mktemp("manage") / "index", corpus(), tiny_bert_dir)


@pytest.fixture()
def index(built, tmp_path):
    return tt.Index.open(private_copy(built, tmp_path))


def _version(index) -> str:
    return index.info()["live_version"]


def test_not_and_text_mask_and_matches_equal_the_reference(index):
    docs = {d["_id"]: d for d in corpus()}
    store = index.store
    for flt in FILTERS:
        want = expected(list(docs.values()), flt)
        parsed = tt.parse_filter(flt)
        mask = parsed.mask(columns_of(store))
        assert sorted(store.doc_ids[r] for r in np.flatnonzero(mask)) == want, flt
        assert sorted(d for d, doc in docs.items() if parsed.matches(metadata_of(doc), doc["text"])) == want, flt
    assert expected(list(docs.values()), {"$text": {"$contains": "tea notes"}}) == []  # titles are not searched
    assert len(expected(list(docs.values()), {"$not": {"year": {"$gt": 2010}}})) > 0


def test_filtered_search_with_not_and_text_returns_only_matches(index):
    docs = corpus()
    for flt in NEW_FILTERS:
        want = set(expected(docs, flt))
        for mode in ("dense", "bm25"):
            hits = index.search("green tea with milk", k=50, mode=mode, filter=flt)
            assert {h.id for h in hits} <= want, (flt, mode)
        assert len(index.search("green tea with milk", k=50, mode="dense", filter=flt)) == len(want), flt


def test_count_list_get_equal_the_reference(index):
    docs = corpus()
    by_id = {d["_id"]: d for d in docs}
    for flt in FILTERS:
        want = expected(docs, flt)
        assert index.count(flt) == len(want), flt
        assert walk_pages(index, flt, limit=4) == want, flt
        page = index.list(flt, limit=3, offset=2)
        assert page.ids == want[2:5] and page.total == len(want), flt
        got = index.get(filter=flt)
        assert [d.id for d in got] == want, flt
        for d in got[:3]:
            assert (d.title, d.text, d.metadata) == (by_id[d.id].get("title", ""), by_id[d.id]["text"],
                                                     metadata_of(by_id[d.id])), flt
    asked = ["g05", "d1", "g00", "g13"]
    flt = {"src": "wiki"}
    assert [d.id for d in index.get(asked, filter=flt)] == [i for i in asked if passes(flt, by_id[i])]
    assert [d.id for d in index.get(filter={"src": "web"}, limit=2)] == expected(docs, {"src": "web"})[:2]
    with pytest.raises(tt.TwoTowerError, match="nope"):
        index.get(["d1", "nope"])
    assert index.list(limit=2, after="zzzz").ids == ["éclair", "中文-1"] and index.count() == len(docs)
    assert index.list(after="中文-1").ids == [] and index.list(after="中文-1").next is None


def test_delete_by_filter_is_one_version(index):
    docs = corpus()
    before = _version(index)
    flt = {"$or": [{"$text": {"$contains": "milk"}}, {"src": "web"}]}
    gone = index.delete(filter=flt)
    assert sorted(gone) == expected(docs, flt)
    assert int(_version(index)[1:]) == int(before[1:]) + 1
    rest = [d for d in docs if not passes(flt, d)]
    assert walk_pages(index, None, 5) == sorted(d["_id"] for d in rest)
    reopened = tt.Index.open(index.path)
    assert reopened.count({"src": "web"}) == 0 and len(reopened) == len(rest)
    assert index.delete(filter={"src": "web"}) == [] and _version(index) == _version(reopened)  # no write
    assert {"d1", "d3"} <= {d["_id"] for d in rest}
    assert index.delete(["d3", "d1"], filter={"src": "wiki"}) == ["d1"]  # d3's src is 'w"eb'
    for bad in ({}, None):
        with pytest.raises(tt.TwoTowerError, match="non-empty filter"):
            index.delete(filter=bad)
    with pytest.raises(tt.TwoTowerError, match="keeps at least one"):
        index.delete(filter={"$not": {"src": "nothing"}})


def _file_sums(index) -> dict:
    return {name: info["sha256"] for name, info in index.info()["files"].items()}


def test_update_changes_metadata_only(index):
    docs = corpus()
    old_sums, old_version = _file_sums(index), _version(index)
    queries = ["green tea", "milk sugar", "python programming"]
    before = {m: index.search(queries, k=10, mode=m) for m in ("dense", "bm25", "hybrid")}
    flt = {"$text": {"$contains": "tea"}}
    updated = index.update(filter=flt, metadata={"reviewed": True, "src": "checked"})
    assert sorted(updated) == expected(docs, flt)
    assert int(_version(index)[1:]) == int(old_version[1:]) + 1
    new_sums = _file_sums(index)
    assert set(new_sums) == set(old_sums)
    changed = {n for n in new_sums if new_sums[n] != old_sums[n]}
    assert changed == {"docs.jsonl", "docs.offsets.npy"}, changed  # vectors, FAISS, BM25, ids: the same bytes
    for m, hits in before.items():
        after = index.search(queries, k=10, mode=m)
        assert [[(h.id, h.score) for h in q] for q in after] == [[(h.id, h.score) for h in q] for q in hits]
    want = {d["_id"]: ({**metadata_of(d), "reviewed": True, "src": "checked"} if passes(flt, d) else metadata_of(d))
            for d in docs}
    reopened = tt.Index.open(index.path, verify=True)
    assert {d.id: d.metadata for d in reopened.get()} == want
    assert reopened.count({"src": "checked"}) == len(updated)
    index.update(["d1", "g00"], metadata=[{"a": 1}, {"b": 2}], merge=False)
    index.update(["g01"], unset=["src", "tags"])
    got = {d.id: d.metadata for d in index.get(["d1", "g00", "g01"])}
    assert got["d1"] == {"a": 1} and got["g00"] == {"b": 2}
    assert got["g01"] == {k: v for k, v in want["g01"].items() if k not in ("src", "tags")}
    title = index.get(["d1"])[0].title
    index.update(["d1"], metadata={"title": "x", "text": "y"})  # metadata is its own namespace (#53 item 2)
    d1 = index.get(["d1"])[0]
    assert d1.metadata == {"a": 1, "title": "x", "text": "y"} and d1.title == title and d1.text != "y"
    with pytest.raises(tt.TwoTowerError, match="same length"):
        index.update(["d1"], metadata=[{}, {}])
    assert index.update(filter={"src": "nothing"}, metadata={"x": 1}) == []


def test_filter_errors_name_the_operator(index):
    for bad, field in (({"$not": {}}, "$not"), ({"$not": [1]}, "$not"), ({"$text": "tea"}, "$text"),
                       ({"$text": {"$contains": ""}}, "$text.$contains"), ({"$text": {"$has": "x"}}, "$text")):
        with pytest.raises(tt.DataError) as err:
            index.count(bad)
        assert err.value.field == field, bad
    with pytest.raises(tt.DataError, match="the document's text"):
        tt.parse_filter({"$text": {"$contains": "x"}}).matches({})


def test_command_line(index):
    from typer.testing import CliRunner

    from twotower.cli import app

    run = CliRunner().invoke
    docs, path = corpus(), str(index.path)
    flt = {"$not": {"src": "wiki"}}
    res = run(app, ["index", "count", "--index", path, "--filter", json.dumps(flt)])
    assert res.exit_code == 0 and res.stdout.strip() == str(len(expected(docs, flt)))
    res = run(app, ["index", "list", "--index", path, "--filter", json.dumps(flt), "--limit", "5", "--json"])
    page = json.loads(res.stdout)
    assert page["ids"] == expected(docs, flt)[:5] and page["total"] == len(expected(docs, flt))
    res = run(app, ["index", "list", "--index", path, "--limit", "5", "--after", page["next"], "--ids-only",
                    "--filter", json.dumps(flt)])
    assert res.stdout.split() == expected(docs, flt)[5:10]
    text_flt = {"$text": {"$contains": "tea"}}
    res = run(app, ["index", "get", "--index", path, "--filter", json.dumps(text_flt)])
    assert [json.loads(line)["_id"] for line in res.stdout.splitlines()] == expected(docs, text_flt)
    res = run(app, ["index", "update", "--index", path, "--filter", json.dumps(text_flt), "--metadata", '{"t": 1}'])
    assert res.exit_code == 0 and tt.Index.open(path).count({"t": 1}) == len(expected(docs, text_flt))
    res = run(app, ["index", "delete", "--index", path])
    assert res.exit_code == 2 and "non-empty filter" in res.output
    res = run(app, ["index", "delete", "--index", path, "--filter", '{"t": 1}'])
    assert res.exit_code == 0 and tt.Index.open(path).count() == len(docs) - len(expected(docs, text_flt))
    res = run(app, ["index", "update", "--index", path, "d1", "--metadata", "{bad"])
    assert res.exit_code == 2 and "--metadata" in res.output and "Traceback" not in res.output


def test_http_service(index):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    secret = "k" * 24
    docs, key = corpus(), {"X-API-Key": secret}
    client = TestClient(create_app(index.path, api_key=secret))
    flt = {"$text": {"$contains": "tea"}, "$not": {"src": "web"}}
    want = expected(docs, flt)
    assert client.post("/count", json={"filter": flt}).json()["count"] == len(want)
    got, after = [], None
    while True:
        body = client.post("/list", json={"filter": flt, "limit": 3, **({"after": after} if after else {})}).json()
        got += body["ids"]
        assert [d["id"] for d in body["documents"]] == body["ids"] and body["total"] == len(want)
        if body["next"] is None:
            break
        after = body["next"]
    assert got == want
    assert client.post("/list", json={"ids": ["g05", "d1"], "documents": False}).json()["ids"] == ["g05", "d1"]
    assert client.post("/documents/delete", json={"filter": flt}).status_code == 401  # no key
    for body in ({}, {"filter": {}}, {"filter": None}):
        res = client.post("/documents/delete", json=body, headers=key)
        assert res.status_code == 422, body
    assert client.post("/count", json={"filter": {"$not": {}}}).status_code == 422
    res = client.patch("/documents", json={"filter": flt, "metadata": {"hot": True}}, headers=key)
    assert res.status_code == 200 and sorted(res.json()["ids"]) == want and res.json()["updated"] == len(want)
    assert client.patch("/documents", json={"metadata": {"x": 1}}, headers=key).status_code == 400
    assert client.patch("/documents", json={"ids": ["d1"], "metadata": {"x": 1}}).status_code == 401
    assert client.get("/documents/" + want[0]).json()["metadata"]["hot"] is True
    res = client.post("/documents/delete", json={"filter": {"hot": True}}, headers=key)
    assert res.status_code == 200 and sorted(res.json()["ids"]) == want
    assert client.post("/count", json={}).json()["count"] == len(docs) - len(want)
    res = client.post("/documents/delete", json={"filter": {"$not": {"src": "none"}}}, headers=key)
    assert res.status_code == 409
    assert client.post("/list", json={"ids": ["nope"]}).status_code == 404


@pytest.mark.parametrize("options", [{"multivector": 2}, {"vectors": "binary"}, {"vectors": "int8", "kind": "hnsw"}],
                         ids=["multivector", "binary", "int8-hnsw"])
def test_update_and_delete_on_other_index_kinds(tiny_bert_dir, tmp_path, options):
    """Every file a version has (offsets, calibration, sign bits, …) is carried by a metadata update, unchanged."""
    docs = corpus()[:20]
    index = tt.Index.build(tmp_path / "index", docs, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, **options)
    sums, before = _file_sums(index), index.search(["green tea", "cats"], k=8)
    flt = {"$not": {"src": "wiki"}}
    assert sorted(index.update(filter=flt, metadata={"u": 1})) == expected(docs, flt)
    after = _file_sums(index)
    assert {n for n in set(sums) | set(after) if sums.get(n) != after.get(n)} == {"docs.jsonl", "docs.offsets.npy"}
    assert [[(h.id, h.score) for h in q] for q in index.search(["green tea", "cats"], k=8)] == \
        [[(h.id, h.score) for h in q] for q in before]
    assert tt.Index.open(index.path, verify=True).count({"u": 1}) == len(expected(docs, flt))
    assert sorted(index.delete(filter={"u": 1})) == expected(docs, flt)
    hits = index.search("green tea", k=20)
    assert {h.id for h in hits} == set(expected(docs, {"src": "wiki"})) and all(h.metadata.get("src") == "wiki"
                                                                                  for h in hits)


def test_a_failed_metadata_update_leaves_the_index_as_it_was(index, monkeypatch):
    from twotower.retrieval.index import relabel

    version, docs_before = _version(index), {d.id: d.metadata for d in index.get()}

    def broken(out, previous, updates):
        (out / "docs.jsonl").write_bytes(b"half")
        raise OSError("disk gone")

    monkeypatch.setattr(relabel, "_write_docs", broken)
    with pytest.raises(OSError, match="disk gone"):
        index.update(filter={"src": "wiki"}, metadata={"x": 1})
    reopened = tt.Index.open(index.path, verify=True)
    assert _version(reopened) == version and {d.id: d.metadata for d in reopened.get()} == docs_before
    assert not list((index.path / "versions").glob(".tmp-*"))


def test_a_reader_of_the_old_version_keeps_its_metadata(index):
    old = tt.Index.open(index.path).store  # a reader's snapshot
    row = old.row_of["d1"]
    before = old.document(row).get("metadata") or {}
    index.update(["d1"], metadata={"fresh": True}, merge=False)
    assert (old.document(row).get("metadata") or {}) == before  # its own version: unchanged
    assert old.refresh().document(old.refresh().row_of["d1"])["metadata"] == {"fresh": True}
