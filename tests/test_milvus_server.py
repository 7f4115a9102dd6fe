"""twotower on a real Milvus server, with authentication on (every call below gives the token).

Binary vectors (issue #54): ``vectors="binary"`` stores the sign bits in a BINARY_VECTOR
field (BIN_FLAT / BIN_IVF_FLAT, Hamming) and rescores ``k × rescore_factor`` candidates from int8 codes kept beside
them, as the local binary index does (:mod:`twotower.retrieval.milvus.vectors`). Checked against the local binary
index (FAISS) on the same vectors, and against numpy for the passages' MaxP. The server is PyPI's standalone Milvus
2.3.5 (``tests/milvus_server.py``); Milvus Lite has no binary field, and the refusals are checked without a server."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pymilvus")

from milvus_server import ROOT_TOKEN, TEST_SETTINGS, available, milvus_server  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402
from twotower.retrieval.index.codecs import pack_bits  # noqa: E402
from twotower.retrieval.index.kinds import IndexSpec  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus.client import TOKEN_ENV  # noqa: E402
from twotower.retrieval.milvus.manage import update_where  # noqa: E402
from twotower.retrieval.milvus.store import MilvusStore, forget_client  # noqa: E402
from twotower.retrieval.store import IndexStore  # noqa: E402

N, DIM = 1000, 384


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = available()
    if reason:
        pytest.skip(reason)
    with milvus_server(tmp_path_factory.mktemp("milvus-server"), authentication=True,
                       settings=TEST_SETTINGS) as running, \
            pytest.MonkeyPatch.context() as env:
        env.setenv(TOKEN_ENV, ROOT_TOKEN)
        yield running.uri
        forget_client(running.uri)


def _corpus(seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((20, DIM)).astype(np.float32)
    v = centers[rng.integers(0, 20, N)] + 1.5 * rng.standard_normal((N, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = v[rng.choice(N, 40, replace=False)] + 0.03 * rng.standard_normal((40, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return [f"d{i}" for i in range(N)], v, q


def _ids(store, rows) -> list[list[str]]:
    return [[store.doc_ids[r] for r in row if r >= 0] for row in rows]


@pytest.mark.parametrize("rescore", ["int8", "none"])
def test_binary_on_a_milvus_server_ranks_and_scores_as_the_local_binary_index(server, tmp_path, rescore):
    ids, v, q = _corpus()
    docs = NewDocs(ids, [""] * N, ["text"] * N, v)
    spec = IndexSpec(vectors="binary", rescore=rescore)
    store = MilvusStore.build(tmp_path / "m", docs, model={"name": "random"}, spec=spec, uri=server,
                              collection=f"binary_{rescore}", show_progress=False)
    local = IndexStore.build(tmp_path / "l", docs, model={"name": "random"}, spec=spec, show_progress=False)
    assert store.manifest["milvus"]["index_type"] == "BIN_FLAT" and store.manifest["milvus"]["metric"] == "HAMMING"
    assert store.manifest["vectors"]["type"] == "binary" and store.manifest["vectors"]["rescore"] == rescore
    scores, rows = store.search(q, 10)
    local_scores, local_rows = local.search(q, 10)
    got, want = _ids(store, rows), [[ids[r] for r in row] for row in local_rows]
    if rescore == "none":  # Hamming distances: many ties at rank 10, but the same distances rank by rank
        assert np.allclose(scores, local_scores, atol=1e-6)
    # the same candidates up to ties of Hamming distance at the cut: nearly always the same documents
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want)]) >= (0.97 if rescore == "int8" else 0.9)
    for i in range(len(q)):  # the same stored codes: a document both return scores the same on both
        mine = dict(zip(got[i], scores[i]))
        for doc, s in zip(want[i], local_scores[i]):
            if doc in mine:
                assert abs(mine[doc] - s) < 1e-5
    if rescore == "int8":  # rescoring is what ranks: scores are near the true inner products, not Hamming's
        true = np.asarray([v[int(got[i][0][1:])] @ q[i] for i in range(len(q))])
        assert np.allclose(scores[:, 0], true, atol=0.03)
        hamming = np.asarray([1 - 2 * np.unpackbits(pack_bits(v[[int(got[i][0][1:])]]) ^ pack_bits(q[[i]])).sum() / DIM
                              for i in range(len(q))])
        assert not np.allclose(scores[:, 0], hamming, atol=0.03)


def test_binary_writes_keep_every_stored_code_and_ivf_finds_the_same(server, tmp_path):
    ids, v, q = _corpus(1)
    extra = np.random.default_rng(2).standard_normal((50, DIM)).astype(np.float32)
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    docs = NewDocs(ids, [""] * N, ["text"] * N, v)
    store = MilvusStore.build(tmp_path / "m", docs, model={"name": "random"}, spec=IndexSpec(kind="ivf", vectors="binary"),
                              uri=server, collection="binary_writes", show_progress=False)
    assert store.manifest["milvus"]["index_type"] == "BIN_IVF_FLAT"
    nlist = store.manifest["milvus"]["index_params"]["nlist"]
    # every list, 250 candidates rescored: an answer that ties of Hamming distance at the cut cannot move
    _, exact_rows = store.search(q, 10, nprobe=nlist, rescore_factor=25)
    exact = _ids(store, exact_rows)  # (rows are numbered per store object)
    before = store.float_vectors(np.asarray(store.rows(ids[100:200])))
    store = store.add(NewDocs([f"n{i}" for i in range(50)], [""] * 50, ["new"] * 50, extra), show_progress=False)
    store = store.remove(ids[:10], show_progress=False)
    store, changed = update_where(store, lambda doc_id, old: {"tag": "x"}, ids=ids[100:200])
    assert len(changed) == 100 and len(store) == N + 50 - 10
    # a metadata update writes the rows again without encoding: bits and int8 codes exactly as they were
    assert np.array_equal(store.float_vectors(np.asarray(store.rows(ids[100:200]))), before)
    _, rows = store.search(extra[:5], 1, nprobe=nlist)
    assert [store.doc_ids[r[0]] for r in rows] == [f"n{i}" for i in range(5)]  # a new document finds itself
    _, rows = store.search(q, 10, nprobe=nlist, rescore_factor=25)
    assert not {d for row in _ids(store, rows) for d in row} & set(ids[:10])  # removed: gone
    kept = [[d for d in row[:5] if d not in ids[:10]] for row in exact]
    assert all(set(a) <= set(b) for a, b in zip(kept, _ids(store, rows)))  # the rest stay
    assert store.documents([ids[150]])[0]["metadata"] == {"tag": "x"}


def test_binary_passages_score_a_document_by_its_best_rescored_passage(server, tmp_path):
    rng = np.random.default_rng(3)
    n_docs, per = 60, 3
    v = rng.standard_normal((n_docs * per, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    texts = ["x" * 30] * n_docs
    spans = np.asarray([[10 * p, 10 * p + 10] for _ in range(n_docs) for p in range(per)], dtype=np.int64)
    docs = NewDocs([f"d{i}" for i in range(n_docs)], [""] * n_docs, texts, v, np.arange(0, n_docs * per + 1, per),
                   spans=spans)
    passages = {"window": 16, "overlap": 2, "max_passages": 1000}
    store = MilvusStore.build(tmp_path / "m", docs, model={"name": "random"}, spec=IndexSpec(vectors="binary"),
                              uri=server, collection="binary_passages", show_progress=False, passages=passages)
    q = v[[5, 100, 151]] + 0.2 * rng.standard_normal((3, DIM)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    scores, rows = store.search(q, 5, rescore_factor=50)  # every passage a candidate: MaxP over all of them
    table = store.passage_table(rows[:, 0])
    for i, target in enumerate([5 // per, 100 // per, 151 // per]):
        assert store.doc_ids[rows[i, 0]] == f"d{target}"
        spans_i, vectors_i = table[int(rows[i, 0])]
        assert spans_i.tolist() == [[0, 10], [10, 20], [20, 30]]
        assert abs(scores[i, 0] - float((vectors_i @ q[i]).max())) < 0.02  # its best passage's score


def test_binary_and_half_precision_refusals_name_the_option(tmp_path):
    ids, v, _ = _corpus()
    docs = NewDocs(ids[:20], [""] * 20, ["t"] * 20, v[:20])
    with pytest.raises(TwoTowerError, match="Milvus Lite .* has no BINARY_VECTOR field"):
        MilvusStore.build(tmp_path / "a", docs, model={"name": "r"}, spec=IndexSpec(vectors="binary"),
                          uri=str(tmp_path / "lite.db"), show_progress=False)
    with pytest.raises(TwoTowerError, match="vectors='fp16'.*int8"):
        MilvusStore.build(tmp_path / "b", docs, model={"name": "r"}, spec=IndexSpec(vectors="fp16"),
                          uri=str(tmp_path / "lite.db"), show_progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "lite.db").exists()  # refused before any write


def test_a_server_without_the_fields_is_refused_before_anything_is_written(server, tmp_path):
    ids, v, _ = _corpus()
    docs = NewDocs(ids[:20], [""] * 20, ["t"] * 20, v[:20])
    with pytest.raises(TwoTowerError, match="kind='hnsw'.*BIN_FLAT or BIN_IVF_FLAT"):
        MilvusStore.build(tmp_path / "h", docs, model={"name": "r"}, spec=IndexSpec(kind="hnsw", vectors="binary"),
                          uri=server, show_progress=False)
    # Milvus 2.3 has no sparse vectors: a BM25 part is refused by the probe, naming it
    with pytest.raises(TwoTowerError, match="refused a collection with a BINARY_VECTOR field and a BM25 sparse field"):
        MilvusStore.build(tmp_path / "s", docs, model={"name": "r"}, spec=IndexSpec(vectors="binary", bm25=True),
                          uri=server, collection="never_made", show_progress=False)
    from pymilvus import MilvusClient

    names = MilvusClient(uri=server, token=ROOT_TOKEN).list_collections()
    assert "never_made" not in names and not any(n.startswith("twotower_probe_") for n in names)
    assert not (tmp_path / "s").exists()


def test_cli_builds_and_searches_binary_on_a_server_as_the_local_binary_index(server, tiny_bert_dir, tmp_path):
    import json

    from typer.testing import CliRunner

    from twotower.cli import app

    words = ["rust", "memory", "okapi", "leaves", "python", "garbage", "forest", "compiler", "river", "stone"]
    rng = np.random.default_rng(4)
    with (tmp_path / "corpus.jsonl").open("w") as f:
        for i in range(40):
            text = " ".join(rng.choice(words, 12))
            f.write(json.dumps({"_id": f"c{i}", "title": "", "text": text}) + "\n")
    run = CliRunner().invoke
    common = ["--data", str(tmp_path / "corpus.jsonl"), "--model", str(tiny_bert_dir), "--precision", "fp32",
              "--no-progress", "--vectors", "binary", "--no-bm25"]  # dense on both (BM25 is off on Milvus by default)
    r = run(app, ["index", "build", *common, "--out", str(tmp_path / "m"), "--backend", "milvus", "--uri", server])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # the console wraps long lines
    assert "binary, rescored against int8 × 4" in said and "BIN_FLAT" in said
    r2 = run(app, ["index", "build", *common, "--out", str(tmp_path / "l")])
    assert r2.exit_code == 0, r2.output
    for query in ("memory safe compiler", "okapi leaves in the forest"):
        got = [json.loads(x) for x in run(app, ["search", query, "--index", str(tmp_path / "m"), "--json", "-k", "5"]
                                          ).output.splitlines() if x.startswith("{")]
        want = [json.loads(x) for x in run(app, ["search", query, "--index", str(tmp_path / "l"), "--json", "-k", "5"]
                                           ).output.splitlines() if x.startswith("{")]
        assert len(got) == 5 and [h["id"] for h in got] == [h["id"] for h in want]
        assert np.allclose([h["score"] for h in got], [h["score"] for h in want], atol=1e-5)
    r = run(app, ["index", "build", *common, "--out", str(tmp_path / "x"), "--backend", "milvus", "--uri",
                  str(tmp_path / "lite.db")])
    assert r.exit_code != 0 and "Milvus Lite" in r.output and "BINARY_VECTOR" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "x").exists()


def test_a_wrong_token_is_refused_by_name_before_anything_is_written(server, tmp_path, monkeypatch):
    ids, v, _ = _corpus()
    docs = NewDocs(ids[:20], [""] * 20, ["t"] * 20, v[:20])
    forget_client(server)
    monkeypatch.setenv(TOKEN_ENV, "root:wrong")
    try:
        with pytest.raises(TwoTowerError) as refused:
            MilvusStore.build(tmp_path / "t", docs, model={"name": "r"}, spec=IndexSpec(), uri=server,
                              collection="never_token", show_progress=False)
        message = str(refused.value)
        assert server in message and "refused the token" in message and TOKEN_ENV in message, message
        assert not (tmp_path / "t").exists()
    finally:
        forget_client(server)  # the next test connects with the right token again
