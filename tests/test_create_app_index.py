"""``tt.create_app(index)`` with an open :class:`twotower.Index` (issue #58): the service serves that index, its
version, its encoder (the same object, loaded once), its precision and device unless given, and writes through the
service reach the store the Index reads; anything but a path or an Index is refused, naming the parameter."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

import twotower as tt  # noqa: E402

KEY = "object-key-0123456789"
TEXTS = ["Green tea is steamed and dried.", "Coffee beans are roasted.", "Black tea is fully oxidised.",
         "Espresso is coffee brewed under pressure."]
KINDS = [{"kind": "tea"}, {"kind": "coffee"}, {"kind": "tea", "origin": {"country": "India"}}, {"kind": "coffee"}]


@pytest.fixture()
def built(tmp_path, tiny_bert_dir):
    return tt.Index.build(tmp_path / "ix", TEXTS, metadatas=KINDS, encoder=str(tiny_bert_dir), bm25=True,
                          precision="fp32", show_progress=False)


def client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)


def test_create_app_serves_the_index_just_built(built):
    ix = built
    app = tt.create_app(ix, api_key=KEY)
    c = client(app)
    # the page and its files, /info of this version
    assert c.get("/").status_code == 200 and "search-form" in c.get("/").text
    assert c.get("/static/search.js").status_code == 200 and c.get("/static/search.css").status_code == 200
    info = c.get("/info").json()
    assert info["version"] == ix.info()["live_version"] and info["documents"] == len(TEXTS)
    assert info["metadata_fields"] == ["kind", "origin.country"]
    # a filtered search answers what the Index answers, and only documents the filter lets through
    for mode in ("dense", "bm25", "hybrid"):
        r = c.post("/search", json={"query": "tea", "k": 4, "mode": mode, "filter": {"kind": "tea"}})
        assert r.status_code == 200, r.text
        got = [(h["id"], round(h["score"], 5)) for h in r.json()["hits"]]
        want = [(h.id, round(h.score, 5)) for h in ix.search("tea", k=4, mode=mode, filter={"kind": "tea"})]
        assert got == want and {h["metadata"]["kind"] for h in r.json()["hits"]} == {"tea"}
        assert sorted(i for i, _ in got) == sorted(ix.added_ids[i] for i in (0, 2))  # the two teas, by hand


def test_the_service_shares_the_indexs_encoder_and_settings(built, tmp_path):
    ix = built
    state = tt.create_app(ix).state.service
    assert state.searcher.encoder is ix._searcher.encoder  # one model in memory, not two
    assert state.searcher is not ix._searcher  # a searcher of its own: the service's snapshots are its own
    assert state.compute_lock is ix._lock  # the service and the Index never run the shared encoder at once
    assert (state.searcher.precision, state.cfg.precision, state.searcher.device) == ("fp32", "fp32", "auto")
    assert state.searcher.query_runtime == "auto"  # the Index's (tt.Index's default: ONNX Runtime on a CPU)

    # given here, a setting wins over the Index's
    state = tt.create_app(ix, precision="auto", query_runtime="torch").state.service
    assert (state.searcher.precision, state.cfg.precision) == ("auto", "auto")
    assert state.searcher.encoder is ix._searcher.encoder
    # another device: an encoder of its own on that device, over the same store
    state = tt.create_app(ix, device="cpu").state.service
    assert state.searcher.encoder is not ix._searcher.encoder and state.compute_lock is not ix._lock
    assert state.searcher.store.root == ix.store.root and str(state.searcher.encoder.device) == "cpu"

    # a path serves the folder with the service's own defaults, as before
    state = tt.create_app(ix.path, query_runtime="torch").state.service
    assert state.searcher.precision == "auto" and state.searcher.encoder is not ix._searcher.encoder


def test_writes_through_the_service_reach_the_index(built):
    ix = built
    c = client(tt.create_app(ix, api_key=KEY))
    r = c.post("/documents", json={"documents": ["Oolong tea is partly oxidised."]}, headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    new_id = r.json()["ids"][0]
    assert new_id == tt.document_id("Oolong tea is partly oxidised.")
    hit = ix.search("oolong", k=1, mode="bm25")[0]  # the Index sees the service's version
    assert hit.id == new_id and ix.info()["num_docs"] == len(TEXTS) + 1
    assert ix.info()["live_version"] == r.json()["version"]
    # and the other way round: the Index's write is the service's next version
    ix.add(["Matcha is ground green tea."])
    health = c.get("/healthz").json()
    assert health["documents"] == len(TEXTS) + 2 and health["version"] == ix.info()["live_version"]
    assert c.get(f"/documents/{ix.added_ids[0]}").json()["text"] == "Matcha is ground green tea."
    assert c.delete(f"/documents/{new_id}", headers={"X-API-Key": KEY}).status_code == 200
    assert new_id not in {h.id for h in ix.search("oolong", k=10, mode="bm25")}


@pytest.mark.parametrize("bad", [42, b"ix", None, ["ix"]])
def test_anything_else_is_refused_naming_the_parameter(bad):
    with pytest.raises(tt.TwoTowerError) as err:
        tt.create_app(bad)
    message = str(err.value)
    assert message.startswith("index: ") and "str or pathlib.Path" in message and "twotower.Index" in message
    assert type(bad).__name__ in message


def test_an_encoder_is_refused_before_anything_loads(built):
    with pytest.raises(tt.TwoTowerError, match=r"^index: .* not Encoder$"):
        tt.create_app(built.encoder)
    # the service's own checks come first for an Index too: a bad option, keyed reads without a key
    with pytest.raises(tt.TwoTowerError, match="precision"):
        tt.create_app(built, precision="fp8")
    with pytest.raises(tt.TwoTowerError, match="keyed reads"):
        tt.create_app(built, keyed_reads=True)


def test_an_index_on_milvus_is_served_as_it_is(tmp_path, tiny_bert_dir):
    """The same on the Milvus backend (Milvus Lite): the service shares the Index's store, so a write through either
    is the other's next version."""
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    ix = tt.Index.build(tmp_path / "mil", TEXTS, metadatas=KINDS, encoder=str(tiny_bert_dir), bm25=True,
                        precision="fp32", show_progress=False, backend="milvus", uri=str(tmp_path / "m.db"),
                        collection="served_object")
    c = client(tt.create_app(ix, api_key=KEY))
    for mode in ("dense", "bm25"):
        r = c.post("/search", json={"query": "tea", "k": 4, "mode": mode, "filter": {"kind": "tea"}})
        assert r.status_code == 200, r.text
        assert [h["id"] for h in r.json()["hits"]] == [h.id for h in ix.search("tea", k=4, mode=mode,
                                                                                 filter={"kind": "tea"})]
    r = c.post("/documents", json={"documents": ["Oolong tea is partly oxidised."]}, headers={"X-API-Key": KEY})
    assert r.status_code == 200, r.text
    assert ix.search("oolong", k=1, mode="bm25")[0].id == r.json()["ids"][0]
    ix.add(["Matcha is ground green tea."])
    assert c.get("/healthz").json()["documents"] == len(TEXTS) + 2
