"""The search service: every endpoint through FastAPI's TestClient, auth, validation, reads during
writes, one real uvicorn process on loopback, and a schemathesis fuzz pass (no 500s)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir  # noqa: E402

KEY = "test-key-0123456789"
HEADERS = {"X-API-Key": KEY}
BASE_IDS = {d["_id"] for d in TINY_CORPUS}


@pytest.fixture()
def index(served_index) -> Path:
    """A private copy of the tiny index (conftest; tests write to it)."""
    return served_index


def make_client(index: Path, **kwargs):
    from conftest import serve_client

    kwargs.setdefault("api_key", KEY)
    return serve_client(index, **kwargs)


@pytest.fixture()
def client(index):
    return make_client(index)


def current(index: Path) -> str:
    return (index / "CURRENT").read_text().strip()


def doc_url(doc_id: str) -> str:
    """How a client names a document: its id percent-encoded as one path segment, dots included
    (a bare "." or ".." segment would be resolved away by the client)."""
    return "/documents/" + quote(doc_id, safe="").replace(".", "%2E")


# ids a document may have, each reachable over HTTP (whitespace is not among them: the one id rule, data.ids)
ODD_IDS = ["a/b", "/leading", "trailing/", "a//b", "a/../b", ".", "..", "100%", "50%25off", "a%2Fb", "with_underscore",
           "-dashed-", "q?x=1#frag", "+plus&amp;", "日本語/ü", "émoji🎉", "back\\slash", "x" * 256]


# ---------------------------------------------------------------------------------------------
# endpoints


def test_search_modes_and_batch(client):
    r = client.post("/search", json={"query": "which feline purrs", "k": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == "v000001" and len(body["hits"]) == 3
    assert all(set(h) == {"id", "score", "title", "metadata", "passages"} and h["id"] in BASE_IDS
               for h in body["hits"])
    scores = [h["score"] for h in body["hits"]]
    assert scores == sorted(scores, reverse=True)

    # BM25 is exact about words: the only document with "purr" is the only hit (no document matching nothing)
    bm = client.post("/search", json={"query": "purr", "k": 2, "mode": "bm25"}).json()["hits"]
    assert len(bm) == 1 and bm[0]["id"] == "d1" and bm[0]["title"] == "Cats" and bm[0]["score"] > 0
    hy = client.post("/search", json={"query": "purr", "k": 2, "mode": "hybrid", "lambda": 0.0}).json()["hits"]
    assert hy[0]["id"] == "d1"

    # k larger than the collection: every document once
    allh = client.post("/search", json={"query": "x", "k": 1000}).json()["hits"]
    assert sorted(h["id"] for h in allh) == sorted(BASE_IDS)

    batch = client.post("/search/batch", json={"queries": ["purr", "tea leaves"], "k": 2, "mode": "bm25"})
    assert batch.status_code == 200
    res = batch.json()["results"]
    assert [r[0]["id"] for r in res] == ["d1", "d5"]
    single = client.post("/search", json={"query": "tea leaves", "k": 2, "mode": "bm25"}).json()["hits"]
    assert res[1] == single


def test_get_add_replace_delete_documents(client, index):
    d = client.get("/documents/d3").json()
    assert d == {"id": "d3", "title": "Python", "text": TINY_CORPUS[2]["text"], "metadata": {}, "version": "v000001"}
    assert client.get("/documents/nope").status_code == 404

    new = {"_id": "n1", "title": "Volcano", "text": "Lava flows from an erupting volcano."}
    r = client.post("/documents", json={"documents": [new]}, headers=HEADERS)
    assert r.status_code == 200, r.text
    assert r.json() == {"version": "v000002", "documents": 7, "added": 1, "replaced": 0, "deleted": 0, "ids": ["n1"]}
    assert current(index) == "v000002"  # durable and live before the answer
    assert client.get("/documents/n1").json()["title"] == "Volcano"
    hits = client.post("/search", json={"query": "lava volcano", "k": 1, "mode": "bm25"}).json()
    assert hits["hits"][0]["id"] == "n1" and hits["version"] == "v000002"

    # the same id again: 409 without replace, replaced with it (the default)
    dup = client.post("/documents", json={"documents": [new], "replace": False}, headers=HEADERS)
    assert dup.status_code == 409 and "n1" in dup.json()["detail"]
    again = client.post("/documents", json={"documents": [{**new, "title": "Geology"}]}, headers=HEADERS).json()
    assert again["replaced"] == 1 and again["documents"] == 7
    assert client.get("/documents/n1").json()["title"] == "Geology"

    # what the service answered is what is on disk
    from twotower.retrieval.store import IndexStore

    store = IndexStore.open(index)
    assert len(store) == 7 and store.document(store.row_of["n1"])["title"] == "Geology"

    gone = client.delete("/documents/n1", headers=HEADERS)
    assert gone.status_code == 200 and gone.json()["documents"] == 6 and gone.json()["deleted"] == 1
    assert client.get("/documents/n1").status_code == 404
    assert client.delete("/documents/n1", headers=HEADERS).status_code == 404


def test_any_id_is_reachable(client, index):
    docs = [{"_id": d, "title": f"t{i}", "text": f"text number {i}"} for i, d in enumerate(ODD_IDS)]
    r = client.post("/documents", json={"documents": docs}, headers=HEADERS)
    assert r.status_code == 200 and r.json()["added"] == len(ODD_IDS), r.text
    for i, d in enumerate(ODD_IDS):
        got = client.get(doc_url(d))
        assert got.status_code == 200, (d, got.text)
        assert got.json()["id"] == d and got.json()["text"] == f"text number {i}", d
    # a "/" may also be sent as is
    assert client.get("/documents/a/b").json()["id"] == "a/b"
    assert client.get("/documents/" + quote("日本語/ü")).json()["id"] == "日本語/ü"
    # ids that differ only by encoding stay apart: "a%2Fb" is its own document, not "a/b"
    assert client.get(doc_url("a%2Fb")).json()["title"] == f"t{ODD_IDS.index('a%2Fb')}"
    assert client.get(doc_url("x" * 1025)).status_code == 422  # the one id rule: at most 1,024 bytes (issue #45)
    assert client.get(doc_url("x" * 300)).status_code == 404  # a valid id, not in the index
    assert client.get(doc_url("a/c")).status_code == 404
    for d in ODD_IDS:
        gone = client.delete(doc_url(d), headers=HEADERS)
        assert gone.status_code == 200, (d, gone.text)
        assert client.get(doc_url(d)).status_code == 404
    from twotower.retrieval.store import IndexStore

    assert set(IndexStore.open(index).row_of) == BASE_IDS
    text = client.get("/metrics").text  # one route label however the id is spelled
    assert f'twotower_requests_total{{method="GET",route="/documents/{{doc_id}}",status="200"}} {len(ODD_IDS) + 3}.0' \
        in text


def test_healthz_metrics_openapi(client):
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["documents"] == 6 and h["dim"] == 32
    client.post("/search", json={"query": "tea"})
    client.post("/search", json={"query": ""})
    text = client.get("/metrics").text
    assert 'twotower_requests_total{method="POST",route="/search",status="200"} 1.0' in text
    assert 'twotower_requests_total{method="POST",route="/search",status="422"} 1.0' in text
    assert 'twotower_request_latency_seconds_count{route="/search"} 2.0' in text
    assert "twotower_index_documents 6.0" in text
    schema = client.get("/openapi.json").json()
    assert {"/search", "/search/batch", "/documents", "/documents/{doc_id}", "/healthz", "/metrics"} <= set(schema["paths"])
    k = schema["components"]["schemas"]["SearchRequest"]["properties"]["k"]
    assert k["maximum"] == 1000 and k["minimum"] == 1


def test_a_write_by_another_process_is_seen(client, index, tmp_path):
    from twotower.retrieval.indexing import EncodeConfig, add_documents

    docs = tmp_path / "more.jsonl"
    docs.write_text(json.dumps({"_id": "cli1", "title": "Moon", "text": "The moon orbits the earth."}) + "\n")
    add_documents(index, docs, cfg=EncodeConfig(show_progress=False, precision="fp32"))
    assert client.get("/documents/cli1").json()["version"] == "v000002"
    assert client.get("/healthz").json()["documents"] == 7


# ---------------------------------------------------------------------------------------------
# auth


def test_writes_need_the_key_and_change_nothing_without_it(client, index):
    doc = {"documents": [{"_id": "x1", "text": "intruder"}]}
    before = current(index)
    missing = client.post("/documents", json=doc)
    assert missing.status_code == 401 and missing.json()["error"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "ApiKey"
    assert client.post("/documents", json=doc, headers={"X-API-Key": "wrong"}).status_code == 403
    assert client.delete("/documents/d1").status_code == 401
    assert client.delete("/documents/d1", headers={"X-API-Key": KEY + "x"}).status_code == 403
    assert current(index) == before and sorted(os.listdir(index / "versions")) == [before]
    assert client.get("/documents/x1").status_code == 404 and client.get("/documents/d1").status_code == 200
    assert client.get("/healthz").json()["documents"] == 6
    text = client.get("/metrics").text
    assert 'twotower_requests_total{method="POST",route="/documents",status="401"} 1.0' in text


def test_no_key_configured_disables_writes(index):
    c = make_client(index, api_key=None)
    r = c.post("/documents", json={"documents": [{"_id": "x1", "text": "t"}]}, headers=HEADERS)
    assert r.status_code == 403 and "start the server with api_key" in r.json()["detail"]
    assert "--" not in r.json()["detail"]
    assert current(index) == "v000001"
    assert c.post("/search", json={"query": "tea"}).status_code == 200
    from twotower.checks import cli_names

    with cli_names():  # made by `twotower serve`: the refusal names its flag (fixed when the app is made)
        cli = make_client(index, api_key=None)
    r = cli.post("/documents", json={"documents": [{"_id": "x1", "text": "t"}]}, headers=HEADERS)
    assert r.status_code == 403 and "start the server with --api-key-file to allow them" in r.json()["detail"]


def test_keyed_reads(index):
    c = make_client(index, open_reads=False)
    assert c.post("/search", json={"query": "tea"}).status_code == 401
    assert c.get("/documents/d1", headers={"X-API-Key": "nope"}).status_code == 403
    assert c.post("/search", json={"query": "tea"}, headers=HEADERS).status_code == 200
    assert c.get("/healthz").status_code == 200  # liveness stays open
    # everything else needs the key too: metrics, the schema, and unknown paths (no probing for routes)
    for path in ("/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/nowhere", "/documents/a/b"):
        r = c.get(path)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.status_code, r.text[:200])
        assert c.get(path, headers={"X-API-Key": "not-the-key-but-long"}).status_code == 403, path
    assert "twotower_requests_total" in c.get("/metrics", headers=HEADERS).text
    schema = c.get("/openapi.json", headers=HEADERS).json()
    assert "/metrics" in schema["paths"] and "/documents/{doc_id}" in schema["paths"]
    # the browsable docs are off: a browser loading them could not send the key
    for path in ("/docs", "/redoc"):
        assert c.get(path, headers=HEADERS).status_code == 404, path
    # with open reads all of them stay open
    o = make_client(index)
    for path in ("/metrics", "/openapi.json", "/docs", "/redoc"):
        assert o.get(path).status_code == 200, path
    from twotower.errors import TwoTowerError
    from twotower.serve.app import create_app

    with pytest.raises(TwoTowerError, match="need an API key"):
        create_app(index, api_key=None, open_reads=False)


# ---------------------------------------------------------------------------------------------
# validation: 4xx JSON, never 500


@pytest.mark.parametrize("body,status", [
    ({"query": "", "k": 3}, 422),
    ({"query": "q" * 2049}, 422),
    ({"query": "tea", "k": 0}, 422),
    ({"query": "tea", "k": 1001}, 422),
    ({"query": "tea", "k": "ten"}, 422),
    ({"query": "tea", "k": 2.5}, 422),
    ({"query": "tea", "mode": "sparse"}, 422),
    ({"query": "tea", "lambda": 1.5}, 422),
    ({"query": 7}, 422),
    ({"query": "tea", "extra": 1}, 422),
    ({"k": 3}, 422),
    ([1, 2], 422),
])
def test_search_validation(client, body, status):
    r = client.post("/search", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"] == "invalid_request" and r.json()["detail"]


@pytest.mark.parametrize("body", [{"query": "tea", "mode": "dense", "lambda": 0.3},
                                  {"query": "tea", "mode": "bm25", "lambda": 0.3}])
def test_lambda_outside_hybrid_is_refused_as_the_cli_refuses_it(client, body):
    r = client.post("/search", json=body)
    assert r.status_code == 400 and '"lambda"' in r.json()["detail"], r.text
    assert client.post("/search", json={**body, "mode": "hybrid"}).status_code == 200


def test_no_mode_on_an_index_with_bm25_is_hybrid_and_takes_lambda(client):
    weighed = client.post("/search", json={"query": "tea", "lambda": 0.3})  # the default mode: hybrid (issue #70)
    assert weighed.status_code == 200, weighed.text
    hybrid = client.post("/search", json={"query": "tea", "mode": "hybrid", "lambda": 0.3}).json()
    assert weighed.json()["hits"] == hybrid["hits"]


def test_other_bad_input(client, index, tmp_path):
    def bad(r, status):
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/json") and r.json()["error"]

    bad(client.post("/search", content=b'{"query": "te', headers={"content-type": "application/json"}), 422)
    bad(client.post("/search", content=b"\xff\xfe", headers={"content-type": "application/json"}), 422)
    bad(client.post("/search/batch", json={"queries": []}), 422)
    bad(client.post("/search/batch", json={"queries": ["q"] * 65}), 422)
    bad(client.post("/search/batch", json={"queries": ["ok", ""]}), 422)
    bad(client.get("/documents/" + "x" * 1025), 422)  # over the id rule's 1,024 bytes
    bad(client.put("/search", json={"query": "tea"}), 405)
    bad(client.get("/nowhere"), 404)
    # body size: declared, and chunked without a Content-Length
    bad(client.post("/search", content=b"x" * (32 * 1024 * 1024 + 1), headers={"content-type": "application/json"}), 413)
    bad(client.post("/search", content=(b"x" * 65536 for _ in range(520)), headers={"content-type": "application/json"}), 413)
    # writes
    bad(client.post("/documents", json={"documents": []}, headers=HEADERS), 422)
    bad(client.post("/documents", json={"documents": [{"_id": "a", "text": "1"}, {"_id": "a", "text": "2"}]},
                    headers=HEADERS), 422)
    bad(client.post("/documents", json={"documents": [{"_id": "", "text": "t"}]}, headers=HEADERS), 422)
    bad(client.post("/documents", json={"documents": [{"_id": "a"}]}, headers=HEADERS), 422)
    assert current(index) == "v000001"
    # the last document cannot go: an index needs one
    c = make_client(index)
    for d in sorted(BASE_IDS)[:-1]:
        assert c.delete(f"/documents/{d}", headers=HEADERS).status_code == 200
    bad(c.delete(f"/documents/{sorted(BASE_IDS)[-1]}", headers=HEADERS), 409)


def test_bm25_mode_on_an_index_without_bm25(tmp_path, tiny_bert_dir):
    from twotower.retrieval.indexing import EncodeConfig, build_index

    data = write_beir(tmp_path / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    build_index(data, tmp_path / "dense-only", model=str(tiny_bert_dir), cfg=EncodeConfig(show_progress=False))
    c = make_client(tmp_path / "dense-only")
    r = c.post("/search", json={"query": "tea", "mode": "bm25"})
    # an app made from Python: the rebuild is named by Index.build's parameter
    assert r.status_code == 400 and "rebuild with bm25=True" in r.json()["detail"]


# ---------------------------------------------------------------------------------------------
# consistency: reads during writes see one whole version


def test_concurrent_reads_during_writes_see_whole_versions(index):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    app = create_app(index, api_key=KEY, precision="fp32")
    added = [f"n{i}" for i in range(6)]
    # version v00000j holds the base documents plus the first j-1 added ones
    expected = {f"v{j + 1:06d}": BASE_IDS | set(added[:j]) for j in range(len(added) + 1)}
    stop = threading.Event()
    seen: list[tuple[str, frozenset]] = []
    problems: list[str] = []

    def reader():
        c = TestClient(app)
        while not stop.is_set():
            r = c.post("/search", json={"query": "programming language", "k": 1000})
            if r.status_code != 200:
                problems.append(f"{r.status_code} {r.text}")
                continue
            body = r.json()
            ids = frozenset(h["id"] for h in body["hits"])
            seen.append((body["version"], ids))
            if ids != expected.get(body["version"]):
                problems.append(f"torn read: {body['version']} returned {sorted(ids)}")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    writer = TestClient(app)
    try:
        for i, doc_id in enumerate(added):
            r = writer.post("/documents", json={"documents": [{"_id": doc_id, "text": f"document number {i}"}]},
                            headers=HEADERS)
            assert r.status_code == 200 and r.json()["version"] == f"v{i + 2:06d}"
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not problems, problems[:3]
    versions = {v for v, _ in seen}
    assert len(seen) > 10 and len(versions) >= 2, (len(seen), versions)
    assert writer.get("/healthz").json()["documents"] == len(BASE_IDS) + len(added)


# ---------------------------------------------------------------------------------------------
# a real uvicorn process on loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_server_process(index, tmp_path):
    import httpx

    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "twotower.cli", "serve", "--index", str(index), "--port", str(port),
         "--api-key-file", str(key_file), "--precision", "fp32"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("server did not answer /healthz within 120 s")
            time.sleep(0.25)
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.get("/healthz").json()["documents"] == 6
            page = c.get("/")  # the search page (tests/test_search_page.py)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert 'id="search-form"' in page.text and c.get("/static/search.js").status_code == 200
            hits = c.post("/search", json={"query": "purr", "k": 2, "mode": "bm25"}).json()["hits"]
            assert hits[0]["id"] == "d1"
            assert c.post("/documents", json={"documents": [{"_id": "r1", "text": "t"}]}).status_code == 401
            assert c.post("/documents", json={"documents": [{"_id": "r1", "text": "real"}]}, headers=HEADERS).status_code == 200
            assert c.get("/documents/r1").json()["text"] == "real"
            odd = ["r/2", "50%25off/ü", "..", "a%2Fb"]
            assert c.post("/documents", json={"documents": [{"_id": d, "text": d} for d in odd]},
                          headers=HEADERS).status_code == 200
            for d in odd:
                assert c.get(doc_url(d)).json()["text"] == d, d
                assert c.delete(doc_url(d), headers=HEADERS).status_code == 200, d
                assert c.get(doc_url(d)).status_code == 404, d
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_api_key_strength(index, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.errors import TwoTowerError
    from twotower.serve.app import create_app, read_api_key

    for weak, why in [("k" * 15, "15 characters long; it must have at least 16"),
                      ("short", "5 characters long"),
                      ("ключ-ключ-ключ-ключ", "16 character.s. outside visible ASCII .the first at position 1."),
                      ("sixteen-chars-ok\x00", "1 character.s. outside visible ASCII .the first at position 17.")]:
        with pytest.raises(TwoTowerError, match=why):
            create_app(index, api_key=weak)
        key_file = tmp_path / "weak.key"
        key_file.write_text(weak + "\n", encoding="utf-8")
        with pytest.raises(TwoTowerError, match=f"--api-key-file {key_file}: .*{why}"):
            read_api_key(key_file)
    ok = tmp_path / "ok.key"
    ok.write_text("k" * 16 + "\nsecond line ignored\n")
    assert read_api_key(ok) == "k" * 16
    # at start-up, before the index is opened (it does not even exist here)
    short = tmp_path / "short.key"
    short.write_text("hunter2\n")
    r = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "missing"), "--api-key-file", str(short)])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and f"--api-key-file {short}: the API key is 7 characters long" in flat, r.output
    assert "hunter2" not in r.output  # the key itself is never echoed


def test_serve_cli_errors(index, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    empty = tmp_path / "empty-key"
    empty.write_text("\n")
    r = CliRunner().invoke(app, ["serve", "--index", str(index), "--api-key-file", str(empty)])
    assert r.exit_code == 2 and "empty" in r.output
    r = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "index directory not found" in r.output


@pytest.mark.parametrize("option, message", [(["--precision", "weird"], "precision 'weird': choose one of auto"),
                                             (["--query-runtime", "x"], "unknown query runtime 'x'")])
def test_bad_option_values_stop_before_the_port_and_the_index(tmp_path, option, message):
    """A bad value is named before anything else is looked at: a busy port and a missing index go unmentioned (a
    bad --precision used to start the service; the runtime was checked only after the model had loaded)."""
    from typer.testing import CliRunner

    import twotower as tt
    from twotower.cli import app

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        r = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "missing"), "--port", port, *option])
    assert r.exit_code == 2 and message in r.output, r.output
    assert "in use" not in r.output and "not found" not in r.output
    kwargs = {"precision": option[1]} if option[0] == "--precision" else {"query_runtime": option[1]}
    with pytest.raises(tt.TwoTowerError, match=message):
        tt.create_app(tmp_path / "missing", **kwargs)


# ---------------------------------------------------------------------------------------------
# fuzzing against the OpenAPI schema


def test_fuzz_openapi_no_server_errors(index):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from hypothesis import strategies as st

    from twotower.serve.app import create_app

    app = create_app(index, api_key=KEY, precision="fp32")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    calls: dict[str, list[int]] = {}
    for result, mode in itertools.product(schema.get_all_operations(), schemathesis.GenerationMode):
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"

        # positive cases follow the schema; negative ones break it (wrong types, out of range, missing fields)
        @settings(max_examples=20, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode), keyed=st.booleans())
        def check(case, keyed):
            response = case.call(headers=HEADERS if keyed else {"X-API-Key": "not-the-key"})
            calls.setdefault(label, []).append(response.status_code)
            assert response.status_code < 500, (label, case.body, response.text)
            if op.method.upper() in ("POST", "DELETE") and op.path.startswith("/documents"):
                # without the key: refused (413: a body over the size limit is refused before it is read)
                assert keyed or response.status_code in (401, 403, 413), (label, response.status_code)

        try:
            check()
        except Unsatisfiable:  # negative cases of an operation without parameters or body: none exist
            assert mode == schemathesis.GenerationMode.NEGATIVE and label in ("GET /healthz", "GET /metrics",
                                                                               "GET /info"), label
    assert set(calls) >= {"POST /search", "POST /search/batch", "GET /documents/{doc_id}", "POST /documents",
                          "DELETE /documents/{doc_id}", "GET /healthz", "GET /metrics", "GET /info"}
    assert sum(len(v) for v in calls.values()) >= 150
    assert 200 in calls["POST /search"] and 422 in calls["POST /search"] and 200 in calls["POST /documents"]
