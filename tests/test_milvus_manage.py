"""Store operations on the Milvus backend (issue #53, item 1), against the real Milvus Lite and the brute-force
reference of tests/manage_cases.py: ``$not`` and ``$text`` select exactly the reference's documents (count, every
page of ``list``, ``get``, a filtered search), the constructs Milvus cannot answer exactly are refused, ``update``
writes metadata only (the stored dense and sparse vectors and every BM25 / dense score unchanged) as one committed
write, ``delete(filter=...)`` is one committed write; and the same through the command line and the HTTP service."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

import twotower as tt  # noqa: E402
from manage_cases import FILTERS, NEW_FILTERS, corpus, expected, metadata_of, passes, walk_pages  # noqa: E402
from twotower.retrieval.milvus.filtering import milvus_filter  # noqa: E402


def _build(root, tiny_bert_dir, collection: str):
    return tt.Index.build(root / collection, corpus(), encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                          show_progress=False, backend="milvus", uri=str(root / "m.db"), collection=collection)


@pytest.fixture(scope="module")
def milvus_root(tmp_path_factory):
    return tmp_path_factory.mktemp("milvusmanage")


@pytest.fixture(scope="module")
def reader(milvus_root, tiny_bert_dir):
    return _build(milvus_root, tiny_bert_dir, "reads")


def test_selection_equals_the_reference(reader):
    docs = corpus()
    for flt in FILTERS:
        want = expected(docs, flt)
        assert reader.count(flt) == len(want), flt
        assert walk_pages(reader, flt, limit=7) == want, flt
        assert [d.id for d in reader.get(filter=flt)] == want, flt
        page = reader.list(flt, limit=3, offset=1)
        assert page.ids == want[1:4] and page.total == len(want), flt
    by_id = {d["_id"]: d for d in docs}
    for d in reader.get(filter={"$text": {"$contains": "a_b"}}):
        assert (d.text, d.metadata) == (by_id[d.id]["text"], metadata_of(by_id[d.id]))
    asked = ["g05", "d1", "g00", "g13"]
    assert [d.id for d in reader.get(asked, filter={"src": "wiki"})] == [i for i in asked if passes({"src": "wiki"},
                                                                                                   by_id[i])]
    with pytest.raises(tt.TwoTowerError, match="nope"):
        reader.get(["d1", "nope"])


def test_filtered_search_with_not_and_text(reader):
    docs = corpus()
    for flt in NEW_FILTERS:
        want = set(expected(docs, flt))
        for mode in ("dense", "bm25"):
            hits = reader.search("green tea with milk", k=50, mode=mode, filter=flt)
            assert {h.id for h in hits} <= want, (flt, mode)
        assert len(reader.search("green tea with milk", k=50, mode="dense", filter=flt)) == len(want), flt


def test_what_milvus_cannot_answer_exactly_is_refused(reader):
    with pytest.raises(tt.DataError) as err:
        reader.count({"$text": {"$contains": "back\\slash"}})
    assert err.value.field == "$text.$contains"
    kinds = {"x": ["number", "string"], "y": ["null", "number"]}
    with pytest.raises(tt.DataError, match="under \\$not") as err:
        milvus_filter({"$not": {"x": {"$gt": 1}}}, kinds)
    assert err.value.field == "x.$gt"
    assert milvus_filter({"x": {"$gt": 1}}, kinds) and milvus_filter({"$not": {"y": {"$lt": 3}}}, kinds)
    assert milvus_filter({"$not": {"$not": {"x": {"$gt": 1}}}}, kinds)  # an even number of $not: not negated


def _rows(index) -> dict:
    from twotower.retrieval.milvus.writes import query_all

    store = index.store
    rows = query_all(store.client, store.collection, store._visible(), ["id", "dense", "sparse"])
    return {r["id"]: (list(map(float, r["dense"])), dict(r["sparse"])) for r in rows}


def _scores(index) -> dict:
    queries = ["green tea", "milk sugar", "python programming"]
    n = len(index)
    return {m: [{h.id: round(h.score, 6) for h in q} for q in index.search(queries, k=n, mode=m)]
            for m in ("dense", "bm25")}


def test_update_and_delete(milvus_root, tiny_bert_dir):
    docs = corpus()
    index = _build(milvus_root, tiny_bert_dir, "writes")
    rows, scores, seq = _rows(index), _scores(index), index.store.seq
    flt = {"$text": {"$contains": "tea"}}
    updated = index.update(filter=flt, metadata={"reviewed": True, "src": "checked"})
    assert sorted(updated) == expected(docs, flt) and index.store.seq == seq + 1
    after = _rows(index)  # no re-encoding: dense vectors and BM25 terms as they were, scores equal
    # (a row's stored sparse weights carry the average length of the write that stored it: issue #54's exact BM25
    # scores from term counts, so a rewritten row's weights may differ while every score stays the same)
    assert {d: (v, sorted(w)) for d, (v, w) in after.items()} == {d: (v, sorted(w)) for d, (v, w) in rows.items()}
    assert _scores(index) == scores
    want = {d["_id"]: ({**metadata_of(d), "reviewed": True, "src": "checked"} if passes(flt, d) else metadata_of(d))
            for d in docs}
    assert {d.id: d.metadata for d in index.get()} == want
    index.update(["d1"], metadata={"a": 1}, merge=False)
    index.update(["g01"], unset=["tags"])
    got = {d.id: d.metadata for d in index.get(["d1", "g01"])}
    assert got == {"d1": {"a": 1}, "g01": {k: v for k, v in want["g01"].items() if k != "tags"}}
    seq = index.store.seq
    gone = index.delete(filter={"src": "checked"})
    assert sorted(gone) == sorted(updated) and index.store.seq == seq + 1
    assert len(index) == len(docs) - len(gone) and index.count({"reviewed": True}) == 0
    assert index.delete(filter={"src": "checked"}) == [] and index.store.seq == seq + 1
    with pytest.raises(tt.TwoTowerError, match="keeps at least one"):
        index.delete(filter={"$not": {"src": "nothing"}})
    reopened = tt.Index.open(index.path)
    assert walk_pages(reopened, None, 9) == sorted(set(want) - set(gone))


def test_command_line_and_http(milvus_root, tiny_bert_dir):
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.serve.app import create_app

    docs = corpus()
    index = _build(milvus_root, tiny_bert_dir, "surfaces")
    path, run = str(index.path), CliRunner().invoke
    flt = {"$not": {"$text": {"$contains": "tea"}}}
    res = run(app, ["index", "count", "--index", path, "--filter", json.dumps(flt)])
    assert res.exit_code == 0 and res.stdout.strip() == str(len(expected(docs, flt)))
    res = run(app, ["index", "list", "--index", path, "--filter", json.dumps(flt), "--limit", "4", "--json"])
    assert json.loads(res.stdout)["ids"] == expected(docs, flt)[:4]
    res = run(app, ["index", "update", "--index", path, "--filter", '{"src": "web"}', "--metadata", '{"w": 1}'])
    assert res.exit_code == 0, res.output
    res = run(app, ["index", "delete", "--index", path, "--filter", '{"w": 1}'])
    assert res.exit_code == 0, res.output
    left = [d for d in docs if d["src"] != "web"]

    secret = "s" * 24
    client = TestClient(create_app(index.path, api_key=secret))
    assert client.post("/count", json={}).json()["count"] == len(left)
    body = client.post("/list", json={"filter": flt, "limit": 50}).json()
    assert body["ids"] == expected(left, flt) and body["next"] is None
    res = client.patch("/documents", json={"filter": {"src": "wiki"}, "metadata": {"z": 2}},
                       headers={"X-API-Key": secret})
    assert res.status_code == 200 and sorted(res.json()["ids"]) == expected(left, {"src": "wiki"})
    assert client.post("/documents/delete", json={"filter": {}}, headers={"X-API-Key": secret}).status_code == 422
    res = client.post("/documents/delete", json={"filter": {"z": 2}}, headers={"X-API-Key": secret})
    assert res.status_code == 200 and res.json()["documents"] == len(left) - len(expected(left, {"src": "wiki"}))
