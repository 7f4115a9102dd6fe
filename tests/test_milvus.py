"""The index on Milvus (issue #32), against the real Milvus Lite (embedded, a local .db file; no stand-in): dense, BM25,
hybrid and RRF equal the local FAISS store's; search, eval, add and remove through the CLI, ``tt.Index`` and the
service; writes acknowledged before a kill -9 survive it; bad URIs and foreign or dropped collections are named.
Replicas and concurrent writers over a Milvus Lite server: ``test_milvus_writes.py``.
A test marked ``milvus_server`` runs against a Milvus server when ``TWOTOWER_MILVUS_URI`` is set."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

import twotower as tt  # noqa: E402
from conftest import TINY_CORPUS, flat_index, subprocess_env, write_beir  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402

WORDS = ("protein cell gene tumor insulin virus neuron muscle bone liver kidney heart blood enzyme receptor membrane "
         "mutation therapy vaccine antibody mouse zebrafish plasma lipid glucose calcium signal pathway stress "
         "immune").split()


def _corpus() -> list[dict]:
    """The tiny corpus plus 40 documents of drawn words (so BM25 has term statistics worth reproducing)."""
    rng = np.random.default_rng(7)
    docs = list(TINY_CORPUS)
    for i in range(40):
        words = rng.choice(WORDS, size=int(rng.integers(4, 15)))
        docs.append({"_id": f"g{i}", "title": " ".join(words[:2]).title(), "text": " ".join(words) + "."})
    return docs


QUERIES = [{"_id": f"q{i}", "text": t} for i, t in enumerate([
    "which feline purrs", "green tea leaves", "memory safe systems programming language", "insulin glucose liver",
    "tumor mutation gene therapy", "zebrafish heart muscle", "immune antibody vaccine virus", "calcium signal neuron",
    "unknownword", "the powerhouse of the cell"])]
QRELS = [("q0", "d1", 1), ("q1", "d5", 1), ("q2", "d4", 1), ("q3", "g1", 1), ("q4", "g2", 1)]


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    """(data dir, local flat index, Milvus flat tt.Index, the Milvus Lite URI) over the same corpus and model."""
    root = tmp_path_factory.mktemp("milvus")
    data = write_beir(root / "data", _corpus(), QUERIES, QRELS)
    local = flat_index(data, tiny_bert_dir, root / "local")
    uri = str(root / "milvus.db")
    index = tt.Index.build(root / "mil", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=uri, collection="tiny_flat")
    return data, local, index, uri


def _ranked(index, mode: str, k: int = 10) -> list[list[tuple[str, float]]]:
    return [[(h.id, h.score) for h in hits] for hits in index.search([q["text"] for q in QUERIES], k=k, mode=mode)]


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid", "rrf"])
def test_milvus_rankings_equal_the_local_store(built, mode):
    """The same ranking as the local flat index, scores within 1e-4 (float32 sums in another order): dense is FLAT/IP
    over the same vectors, BM25 the local bm25s weights as sparse vectors, hybrid/RRF twotower's fusion of those two
    lists. The one tolerance: documents of equal score (within 1e-4; the drawn documents repeat term counts) may come
    in another order, so a different id at a rank must be one the local index scores the same there."""
    _, local_dir, milvus, _ = built
    local = tt.Index.open(local_dir, precision="fp32")
    want, got, deeper = _ranked(local, mode), _ranked(milvus, mode), _ranked(local, mode, k=30)
    for w, g, d in zip(want, got, deeper):
        assert len(g) == len(w)
        np.testing.assert_allclose([s for _, s in g], [s for _, s in w], atol=1e-4)
        local_score = dict(d)
        for (gid, gs), (wid, ws) in zip(g, w):
            if gid != wid:
                assert gid in local_score and abs(local_score[gid] - ws) < 1e-4, (gid, wid)
    if mode == "dense":
        assert [[i for i, _ in r] for r in got] == [[i for i, _ in r] for r in want]  # no ties among float vectors
    if mode == "bm25":
        assert got[8] == [] and want[8] == []  # a query of no indexed term: no hits, not k arbitrary documents
        assert all(len(r) < 10 for r in got[:2])  # documents sharing no term are left out, as locally


def test_manifest_collection_and_documents(built):
    _, _, milvus, uri = built
    info = milvus.info()
    assert info["backend"] == "milvus" and info["num_docs"] == 46 and info["dim"] == 32
    assert info["milvus"]["uri"] == uri and info["milvus"]["collection"] == "tiny_flat"
    assert info["milvus"]["index_type"] == "FLAT" and info["milvus"]["lexical"] == "twotower-bm25-sparse"
    assert not list((milvus.path / "versions" / info["live_version"]).glob("*.npy"))  # no vectors kept locally
    assert milvus.documents(["d5"]) == [{"_id": "d5", "title": "Tea", "text": TINY_CORPUS[4]["text"]}]
    with pytest.raises(TwoTowerError, match="not in the index.*'nope'"):
        milvus.documents(["nope"])
    local = tt.Index.open(built[1], precision="fp32")
    for query in ("green tea", "insulin glucose liver"):  # Rocchio on vectors read back from Milvus
        got, want = milvus.search(query, k=5, prf_depth=3), local.search(query, k=5, prf_depth=3)
        assert [h.id for h in got] == [h.id for h in want] and [h.id for h in got] != \
            [h.id for h in milvus.search(query, k=5, mode="dense")]


def test_hnsw_maps_to_milvus_hnsw_with_its_settings(built, tiny_bert_dir, tmp_path):
    data, local_dir, _, uri = built
    hnsw = tt.Index.build(tmp_path / "h", data, encoder=str(tiny_bert_dir), kind="hnsw", hnsw_m=8, ef_construction=64,
                          precision="fp32", show_progress=False, backend="milvus", uri=uri, collection="tiny_hnsw")
    m = hnsw.info()["milvus"]
    assert m["index_type"] == "HNSW" and m["index_params"] == {"M": 8, "efConstruction": 64}
    from twotower.retrieval.milvus.store import client_for

    described = client_for(uri, "--uri").describe_index("tiny_hnsw", "dense")  # what Milvus itself holds
    assert described["index_type"] == "HNSW" and described["metric_type"] == "IP"
    # the settings reach Milvus Lite (it reads only a "params" key; pymilvus 3 sent them as top-level keys, ignored)
    assert described["params"] == {"M": 8, "efConstruction": 64}
    local = tt.Index.open(local_dir, precision="fp32")  # 46 documents, ef 128: HNSW finds the exact top 5
    assert [h.id for h in hnsw.search("green tea leaves", k=5, ef_search=64)] == \
        [h.id for h in local.search("green tea leaves", k=5, mode="dense")]
    with pytest.raises(TwoTowerError, match="nprobe applies to IVF"):
        hnsw.search("tea", nprobe=4)
    ivf = tt.Index.build(tmp_path / "i", data, encoder=str(tiny_bert_dir), kind="ivf", nlist=4, precision="fp32",
                         show_progress=False, backend="milvus", uri=uri, collection="tiny_ivf")
    assert ivf.info()["milvus"]["index_type"] == "IVF_FLAT" and ivf.info()["milvus"]["index_params"] == {"nlist": 4}
    assert client_for(uri, "--uri").describe_index("tiny_ivf", "dense")["params"] == {"nlist": 4}
    # nprobe reaches Milvus: one list of 4 holds fewer than 30 of the 46 documents, all 4 hold them all (Milvus Lite
    # 3.2's IVF_FLAT returns only the hits of the lists it probed)
    hits = [len(ivf.search("green tea leaves", k=30, nprobe=n)) for n in (1, 4)]
    assert hits[0] < hits[1] == 30
    with pytest.raises(TwoTowerError, match="efSearch applies to HNSW"):
        ivf.search("tea", ef_search=16)


def test_api_add_replace_remove(built, tiny_bert_dir, tmp_path):
    data, _, _, uri = built
    index = tt.Index.build(tmp_path / "w", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=uri, collection="tiny_writes")
    index.add([{"_id": "n1", "title": "Axolotl", "text": "Axolotls regrow limbs."}])
    assert len(index) == 47 and index.info()["live_version"] == "v000002"
    assert [h.id for h in index.search("axolotl", k=3, mode="bm25")] == ["n1"]  # a term the build never saw
    with pytest.raises(TwoTowerError, match="already in the index.*'n1'"):
        index.add([{"_id": "n1", "text": "again"}])
    index.add([{"_id": "n1", "title": "Axolotl", "text": "Salamanders of Mexico."}], replace=True)
    assert index.documents(["n1"])[0]["text"] == "Salamanders of Mexico." and len(index) == 47
    index.remove(["n1", "d5"])
    assert len(index) == 45 and "d5" not in [h.id for h in index.search("green tea", k=45, mode="bm25")]
    with pytest.raises(TwoTowerError, match="not in the index.*'d5'"):
        index.remove(["d5"])
    reopened = tt.Index.open(tmp_path / "w")  # the manifest's fingerprint follows the writes
    assert len(reopened) == 45 and reopened.info()["corpus"] == index.info()["corpus"]


def test_a_fitted_models_choices_apply(built, tiny_bert_dir, tmp_path):
    """A model fitted to hybrid retrieval (λ 0.3): its Milvus index gets the BM25 side unasked, and a search without a
    mode ranks as hybrid with λ 0.3 — as the local index of that model does."""
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.defaults import RetrievalDefaults, write_defaults

    data, _, _, uri = built
    model = tmp_path / "fitted"
    DualEncoder.load(str(tiny_bert_dir)).save(model)
    write_defaults(model, RetrievalDefaults(mode="hybrid", lam=0.3))
    index = tt.Index.build(tmp_path / "f", data, encoder=str(model), precision="fp32", show_progress=False,
                           backend="milvus", uri=uri, collection="tiny_fitted")
    local = tt.Index.build(tmp_path / "fl", data, encoder=str(model), precision="fp32", show_progress=False)
    assert index.info()["bm25"] and index.resolve() == ("hybrid", 0.3)
    queries = [q["text"] for q in QUERIES[:5]]
    got = [[h.id for h in hits] for hits in index.search(queries, k=5)]
    assert got == [[h.id for h in hits] for hits in index.search(queries, k=5, mode="hybrid", lam=0.3)]
    assert got == [[h.id for h in hits] for hits in local.search(queries, k=5)]
    assert got != [[h.id for h in hits] for hits in index.search(queries, k=5, mode="dense")]


def test_cli_build_search_eval_add_remove(built, tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    data, _, milvus, uri = built
    run = CliRunner().invoke
    out = tmp_path / "cli-idx"
    r = run(app, ["index", "build", "--data", str(data), "--out", str(out), "--model", str(tiny_bert_dir), "--bm25",
                  "--precision", "fp32", "--no-progress", "--backend", "milvus", "--uri", uri])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "versions" / "v000001" / "manifest.json").read_text())["milvus"]["collection"] == \
        "twotower_cli_idx"
    r = run(app, ["search", "memory safe systems programming language", "--index", str(out), "--mode", "hybrid",
                  "--json", "-k", "3"])
    assert r.exit_code == 0, r.output
    hits = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    want = milvus.search("memory safe systems programming language", k=3, mode="hybrid")
    assert [h.get("id", h.get("doc_id")) for h in hits] == [h.id for h in want]
    r = run(app, ["eval", "--data", str(data), "--index", str(out), "--retriever", "bm25", "--no-progress"])
    assert r.exit_code == 0, r.output
    expected = tt.evaluate(milvus, tt.load_beir(data), mode="bm25").metrics["ndcg@10"]
    assert f"{expected:.4f}" in r.output
    (tmp_path / "new.jsonl").write_text(json.dumps({"_id": "n9", "title": "Okapi", "text": "Okapis eat leaves."}) + "\n")
    r = run(app, ["index", "add", "--index", str(out), "--docs", str(tmp_path / "new.jsonl"), "--no-progress"])
    assert r.exit_code == 0 and "47 documents" in r.output, r.output
    r = run(app, ["index", "remove", "--index", str(out), "n9", "d1"])
    assert r.exit_code == 0 and "45 documents" in r.output, r.output
    r = run(app, ["index", "build", "--data", str(data), "--out", str(tmp_path / "x"), "--model", str(tiny_bert_dir),
                  "--backend", "milvus", "--uri", "http://127.0.0.1:1"])
    assert r.exit_code != 0 and "--uri http://127.0.0.1:1: cannot reach a Milvus server" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "x").exists()


def test_service_writes_and_reads(built, tiny_bert_dir, tmp_path):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    data, _, _, uri = built
    tt.Index.build(tmp_path / "s", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                   show_progress=False, backend="milvus", uri=uri, collection="tiny_serve")
    client = TestClient(create_app(tmp_path / "s", api_key="k" * 16, precision="fp32", query_runtime="torch"))
    key = {"X-API-Key": "k" * 16}
    r = client.post("/documents", headers=key, json={"documents": [{"_id": "s1", "title": "Quokka",
                                                                    "text": "Quokkas smile."}]})
    assert r.status_code == 200, r.text
    r = client.post("/search", json={"query": "quokka", "k": 2, "mode": "bm25"})
    assert r.status_code == 200 and [h["id"] for h in r.json()["hits"]] == ["s1"], r.text
    assert client.get("/documents/s1").json()["title"] == "Quokka"
    assert client.delete("/documents/s1", headers=key).status_code == 200
    assert client.get("/documents/s1").status_code == 404
    from twotower.retrieval.milvus.store import client_for

    client_for(uri, "--uri").drop_collection("tiny_serve")  # deleted under the running server
    # a condition of the store, not of the request: 503 naming the collection, for reads and writes alike
    for r in (client.post("/search", json={"query": "green tea", "k": 2}), client.get("/documents/d1"),
              client.post("/documents", headers=key, json={"documents": [{"_id": "s2", "text": "Wombats dig."}]})):
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "unavailable" and "collection 'tiny_serve'" in r.json()["detail"], r.text
        assert "does not exist (dropped?)" in r.json()["detail"] and "Traceback" not in r.text, r.text


def test_bad_input_is_named_before_encoding(built, tiny_bert_dir, tmp_path):
    data, _, milvus, uri = built
    build = tt.Index.build

    def fails(match: str, **kwargs):
        with pytest.raises(TwoTowerError, match=match):
            build(tmp_path / "bad", data, encoder=str(tiny_bert_dir), show_progress=False, **kwargs)
        assert not (tmp_path / "bad").exists()

    fails("^uri http://127.0.0.1:1: cannot reach a Milvus server", backend="milvus", uri="http://127.0.0.1:1")
    fails("credentials do not go in the URI", backend="milvus", uri="http://u:p@localhost:19530")
    fails("must end in .db", backend="milvus", uri=str(tmp_path / "m.sqlite"))
    fails("does not exist; create it first", backend="milvus", uri=str(tmp_path / "no" / "m.db"))
    fails("^collection='tiny_flat': .* already holds a collection of that name \\(the index of model", backend="milvus",
          uri=uri, collection="tiny_flat")
    fails("^collection '1x'", backend="milvus", uri=uri, collection="1x")
    fails("^kind='ivfpq': on Milvus choose one of flat, hnsw, ivf .*need backend='faiss'", backend="milvus", uri=uri,
          kind="ivfpq")
    fails("^vectors='binary': Milvus Lite .* has no BINARY_VECTOR field; give a Milvus server", backend="milvus",
          uri=uri, vectors="binary")
    fails("^rescore='int4': choose one of int8, fp32, none", backend="milvus", uri=uri, vectors="binary",
          rescore="int4")
    fails("name a Milvus location: pass backend=tt.Milvus", uri=uri)
    # eval against another corpus: the differences named (listing the collection's ids), nothing scored
    other_corpus = [d for d in _corpus() if d["_id"] != "g3"] + [{"_id": "z1", "title": "", "text": "Extra."}]
    other_data = write_beir(tmp_path / "other", other_corpus, QUERIES, QRELS)
    with pytest.raises(TwoTowerError, match="different corpus.*1 document\\(s\\) of the corpus are not in the index "
                                            "\\(e.g. 'z1'\\); 1 document\\(s\\) of the index are not in the corpus"):
        tt.evaluate(milvus, tt.load_beir(other_data))
    # an index folder whose collection was dropped, and one whose collection now belongs to another index
    other = build(tmp_path / "o", data, encoder=str(tiny_bert_dir), show_progress=False, backend="milvus", uri=uri,
                  collection="tiny_other")
    from twotower.retrieval.milvus.store import client_for

    client_for(uri, "--uri").drop_collection("tiny_other")
    with pytest.raises(TwoTowerError, match="Milvus collection 'tiny_other' at .* does not exist"):
        tt.Index.open(other.path)
    manifest = other.path / "versions" / "v000001" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["milvus"]["collection"] = "tiny_flat"
    manifest.write_text(json.dumps(m))
    with pytest.raises(TwoTowerError, match="collection 'tiny_flat' .* belongs to another index"):
        tt.Index.open(other.path)


_WRITER = textwrap.dedent(
    """
    import sys
    import twotower as tt

    index = tt.Index.open(sys.argv[1], precision="fp32")
    for i in range(1000):
        index.add([{"_id": f"k{i}", "title": "Kill", "text": f"document number {i} written before the kill"}])
        print(f"ACK k{i}", flush=True)
    """
)


def test_kill9_during_writes_loses_nothing_acknowledged(built, tiny_bert_dir, tmp_path):
    """A writer adds documents one by one, printing each id once ``add`` returned (Milvus flushed); SIGKILL after a
    few: every acknowledged id is in the collection and the index opens and searches."""
    from twotower.retrieval.milvus.store import forget_client

    data, _, _, _ = built
    uri = str(tmp_path / "kill.db")  # a file of its own: Milvus Lite opens a file in one process at a time
    tt.Index.build(tmp_path / "k", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                   show_progress=False, backend="milvus", uri=uri, collection="tiny_kill")
    forget_client(uri)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "k")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env(PYTHONUNBUFFERED="1"))
    acked = []
    try:
        while len(acked) < 4:
            line = proc.stdout.readline()
            assert line.startswith("ACK "), proc.stderr.read()
            acked.append(line.split()[1])
            if len(acked) == 1:  # the writer holds the Lite file: another process is told so, not left hanging
                with pytest.raises(TwoTowerError, match="only one process at a time can open a Milvus Lite file"):
                    tt.Index.open(tmp_path / "k")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    reopened = tt.Index.open(tmp_path / "k", precision="fp32")
    docs = reopened.documents(acked)  # an unknown (lost) id would be an error
    assert [d["_id"] for d in docs] == acked
    assert reopened.search("document number 2 written before the kill", k=1, mode="bm25")[0].id.startswith("k")
    forget_client(uri)


@pytest.mark.milvus_server
@pytest.mark.skipif(not os.environ.get("TWOTOWER_MILVUS_URI"),
                    reason="needs a Milvus server: set TWOTOWER_MILVUS_URI=http://host:19530 (and "
                           "TWOTOWER_MILVUS_TOKEN if it needs a token)")
def test_on_a_milvus_server(built, tiny_bert_dir, tmp_path):
    data, local_dir, _, _ = built
    name = f"twotower_test_{uuid.uuid4().hex[:12]}"
    index = tt.Index.build(tmp_path / "srv", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=os.environ["TWOTOWER_MILVUS_URI"],
                           collection=name)
    try:
        local = tt.Index.open(local_dir, precision="fp32")
        for mode in ("dense", "bm25", "hybrid"):
            assert [[d for d, _ in r] for r in _ranked(index, mode)] == [[d for d, _ in r] for r in _ranked(local, mode)]
        index.add([{"_id": "n1", "title": "Axolotl", "text": "Axolotls regrow limbs."}])
        assert [h.id for h in index.search("axolotl", k=1, mode="bm25")] == ["n1"]
    finally:
        from twotower.retrieval.milvus.store import client_for

        client_for(os.environ["TWOTOWER_MILVUS_URI"], "--uri").drop_collection(name)


@pytest.mark.milvus_server
@pytest.mark.skipif(not (os.environ.get("TWOTOWER_MILVUS_URI") and os.environ.get("TWOTOWER_MILVUS_TOKEN")),
                    reason="needs a Milvus server with authentication on: set TWOTOWER_MILVUS_URI=http://host:19530 "
                           "and TWOTOWER_MILVUS_TOKEN=user:password")
def test_a_wrong_token_is_named(built, tiny_bert_dir, tmp_path, monkeypatch):
    from twotower.retrieval.milvus.client import TOKEN_ENV, forget_client

    data, _, _, _ = built
    uri = os.environ["TWOTOWER_MILVUS_URI"]
    forget_client(uri)
    monkeypatch.setenv(TOKEN_ENV, f"root:wrong-{uuid.uuid4().hex}")
    try:
        with pytest.raises(TwoTowerError) as refused:
            tt.Index.build(tmp_path / "t", data, encoder=str(tiny_bert_dir), precision="fp32", show_progress=False,
                           backend="milvus", uri=uri, collection=f"twotower_test_{uuid.uuid4().hex[:12]}")
        message = str(refused.value)  # connecting, or the first call on the connection, names the URI and the variable
        assert uri in message and "refused the token" in message and TOKEN_ENV in message, message
        assert not (tmp_path / "t").exists()
    finally:
        forget_client(uri)  # the next test connects with the right token again
