"""The persistent index: build/open/search, add, replace, remove, bad input, SIGKILL midway, readers
during writes. Store-level tests use random vectors; the text-level ones the tiny random BERT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from twotower.errors import DataError
from twotower.retrieval.store import (
    DimensionError, IndexSpec, IndexStore, IndexStoreError, NewDocs, UnknownIdError,
)

MODEL = {"name": "test", "path": "/nonexistent"}
DIM = 16


def _docs(ids, seed=0, dim=DIM):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((len(ids), dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return NewDocs(list(ids), [f"title {i}" for i in ids], [f"text about {i}" for i in ids], v)


@pytest.fixture()
def store(tmp_path) -> IndexStore:
    return IndexStore.build(tmp_path / "idx", _docs([f"d{i}" for i in range(50)]), model=MODEL,
                            spec=IndexSpec(bm25=True), show_progress=False)


def test_build_open_search(store, tmp_path):
    opened = IndexStore.open(tmp_path / "idx", verify=True)
    assert opened.version == "v000001" and len(opened) == 50
    assert isinstance(opened.vectors, np.memmap)
    m = opened.manifest
    assert (m["dim"], m["kind"], m["factory"], m["num_docs"], m["num_vectors"]) == (16, "flat", "Flat", 50, 50)
    assert set(m["files"]) >= {"vectors.npy", "doc_ids.json", "docs.jsonl", "faiss.index"}
    assert all(len(f["sha256"]) == 64 for f in m["files"].values())
    q = np.asarray(opened.vectors[[7, 30]])
    scores, rows = opened.search(q, k=3)
    assert rows[:, 0].tolist() == [7, 30]
    assert scores[:, 0] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert opened.document(7) == {"_id": "d7", "title": "title d7", "text": "text about d7"}
    bm_scores, bm_rows = opened.bm25.search(["text about d9"], k=1, show_progress=False)
    assert opened.doc_ids[bm_rows[0, 0]] == "d9"


def test_add_then_search(store, tmp_path):
    new = _docs(["n1", "n2"], seed=5)
    added = store.add(new, show_progress=False)
    assert added.version == "v000002" and len(added) == 52
    assert len(store) == 50  # the old snapshot is untouched
    reopened = IndexStore.open(tmp_path / "idx")
    _, rows = reopened.search(new.vectors, k=1)
    assert [reopened.doc_ids[r] for r in rows[:, 0]] == ["n1", "n2"]
    _, rows = reopened.search(np.asarray(store.vectors[[3]]), k=1)
    assert reopened.doc_ids[rows[0, 0]] == "d3"
    _, bm_rows = reopened.bm25.search(["text about n2"], k=1, show_progress=False)
    assert reopened.doc_ids[bm_rows[0, 0]] == "n2"
    # the old vector file was copied, not re-encoded: identical rows
    np.testing.assert_array_equal(np.asarray(reopened.vectors[:50]), np.asarray(store.vectors))


def test_add_to_ann_index_keeps_its_training(tmp_path):
    ids = [f"d{i}" for i in range(400)]
    s = IndexStore.build(tmp_path / "ivf", _docs(ids), model=MODEL, spec=IndexSpec(kind="ivf", nlist=8),
                         show_progress=False)
    assert s.manifest["factory"] == "IVF8,Flat"
    s2 = s.add(_docs(["x"], seed=9), show_progress=False)
    _, rows = s2.search(_docs(["x"], seed=9).vectors, k=1, nprobe=8)
    assert s2.doc_ids[rows[0, 0]] == "x"
    with pytest.raises(IndexStoreError, match="efSearch applies to HNSW indexes"):
        s2.search(s2.vectors[:1], k=1, ef_search=10)


def test_duplicate_ids_rejected_unless_replace(store):
    with pytest.raises(IndexStoreError) as err:
        store.add(_docs(["d1", "new"]), show_progress=False)
    assert str(err.value) == (
        f"{store.root}: 1 document id(s) are already in the index: 'd1' (pass replace=True to overwrite them)"
    )
    replaced = store.add(_docs(["d1"], seed=42), replace=True, show_progress=False)
    assert len(replaced) == 50
    np.testing.assert_allclose(replaced.vectors_for(["d1"])[0], _docs(["d1"], seed=42).vectors)
    _, rows = replaced.search(_docs(["d1"], seed=42).vectors, k=1)
    assert replaced.doc_ids[rows[0, 0]] == "d1"


def test_unknown_ids(store):
    with pytest.raises(UnknownIdError) as err:
        store.documents(["d1", "nope", "gone"])
    assert str(err.value) == f"{store.root}: 2 document id(s) not in the index (version v000001): 'nope', 'gone'"
    with pytest.raises(UnknownIdError, match="1 document id\\(s\\) not in the index"):
        store.remove(["zzz"])
    smaller = store.remove(["d0", "d1"], show_progress=False)
    assert len(smaller) == 48 and "d0" not in smaller.row_of
    assert smaller.faiss_index.ntotal == 48


def test_wrong_dimension(store):
    with pytest.raises(DimensionError) as err:
        store.add(_docs(["x"], dim=8), show_progress=False)
    assert str(err.value) == (
        f"new vectors have dimension 8 but the index at {store.root} holds 16-d vectors (model test); "
        "encode with the index's model"
    )
    with pytest.raises(DimensionError, match="query vectors have dimension 4 but the index at .* holds 16-d vectors"):
        store.search(np.zeros((1, 4), np.float32))


def test_corrupt_manifest(store, tmp_path):
    manifest = store.dir / "manifest.json"
    good = manifest.read_text()
    manifest.write_text(good[:40])
    with pytest.raises(DataError) as err:
        IndexStore.open(tmp_path / "idx")
    assert str(err.value).startswith(f"{manifest}, line ")
    assert "corrupt manifest: " in str(err.value)
    assert str(err.value).endswith("(restore the file or rebuild the index with 'twotower index build')")

    data = json.loads(good)
    del data["dim"]
    manifest.write_text(json.dumps(data))
    with pytest.raises(DataError) as err:
        IndexStore.open(tmp_path / "idx")
    assert str(err.value) == (
        f"{manifest}, field 'dim': corrupt manifest: missing field (restore the file or rebuild the index)"
    )
    manifest.write_text(good)
    vec = store.dir / "vectors.npy"
    vec.write_bytes(vec.read_bytes()[:-8])
    with pytest.raises(DataError) as err:
        IndexStore.open(tmp_path / "idx")
    size = vec.stat().st_size
    assert str(err.value) == (
        f"{manifest}, field 'files': index does not match its manifest: vectors.npy has {size} bytes, "
        f"expected {size + 8} (restore the index directory or rebuild it)"
    )


def test_checksum_and_not_an_index(store, tmp_path):
    path = store.dir / "doc_ids.json"
    text = path.read_text()
    path.write_text(text.replace('"d1"', '"x1"'))  # same size, different bytes
    IndexStore.open(tmp_path / "idx")  # sizes match: opens without verify
    with pytest.raises(DataError, match="doc_ids.json: fails its sha256 checksum"):
        IndexStore.open(tmp_path / "idx", verify=True)
    with pytest.raises(IndexStoreError, match="not an index directory \\(no CURRENT file"):
        IndexStore.open(tmp_path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "f.txt").write_text("x")
    with pytest.raises(IndexStoreError, match="exists and is not an index directory"):
        IndexStore.build(tmp_path / "junk", _docs(["a"]), model=MODEL, show_progress=False)
    (tmp_path / "fitted" / "model").mkdir(parents=True)  # a fit folder: said, with the way to index its model
    (tmp_path / "fitted" / "fit.json").write_text("{}")
    with pytest.raises(IndexStoreError, match=r"not an index directory \(it holds fit.json: a fit folder; index its "
                                              r"model with encoder='.*fitted/model'\); choose an empty or new path$"):
        IndexStore.build(tmp_path / "fitted", _docs(["a"]), model=MODEL, show_progress=False)


def test_bad_kind_and_small_pq(tmp_path):
    with pytest.raises(IndexStoreError, match="FAISS cannot build index kind 'NotAFactory'"):
        IndexStore.build(tmp_path / "a", _docs(["a", "b"]), model=MODEL, spec=IndexSpec(kind="NotAFactory"),
                         show_progress=False)
    with pytest.raises(IndexStoreError, match="needs at least 256 vectors to train"):
        IndexStore.build(tmp_path / "b", _docs(["a", "b"]), model=MODEL, spec=IndexSpec(kind="ivfpq"),
                         show_progress=False)
    assert not (tmp_path / "a" / "CURRENT").exists()


_KILL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from twotower.retrieval import store as st
    from twotower.retrieval.index import kinds, writer

    root, op, where = sys.argv[1], sys.argv[2], sys.argv[3]
    module = writer if where == "fill_version" else kinds
    target = getattr(module, where)

    def hang(*args, **kwargs):
        out = target(*args, **kwargs) if where == "fill_version" else None
        print("MIDWAY", flush=True)
        time.sleep(120)
        return out

    setattr(module, where, hang)
    rng = np.random.default_rng(1)
    v = rng.standard_normal((30, 16)).astype(np.float32)
    ids = [f"k{i}" for i in range(30)]
    docs = st.NewDocs(ids, ids, ids, v)
    if op == "build":
        st.IndexStore.build(root, docs, model={"name": "test"}, show_progress=False)
    else:
        st.IndexStore.open(root).add(docs, show_progress=False)
    """
)


@pytest.mark.parametrize("op,where", [("build", "add_in_chunks"), ("add", "fill_version"), ("add", "add_in_chunks")])
def test_sigkill_midway_leaves_previous_index_loadable(store, tmp_path, op, where):
    root = tmp_path / "idx"
    before = sorted(p.name for p in (root / "versions").iterdir())
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(root), op, where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        assert line.strip() == "MIDWAY", proc.stderr.read()
        assert any(p.name.startswith(".tmp-") for p in (root / "versions").iterdir())  # really midway
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    reopened = IndexStore.open(root, verify=True)
    assert reopened.version == "v000001" and len(reopened) == 50 and "k0" not in reopened.row_of
    _, rows = reopened.search(np.asarray(reopened.vectors[[4]]), k=1)
    assert rows[0, 0] == 4
    # the next write succeeds and sweeps the killed writer's temp dir
    after = reopened.add(_docs(["z"], seed=3), show_progress=False)
    assert len(after) == 51
    assert not any(p.name.startswith(".tmp-") for p in (root / "versions").iterdir())
    assert before == ["v000001"]


def test_index_files_open_under_the_npy_lock(store, tmp_path):
    """Opening a version (and its BM25) reads .npy headers under twotower.io.NPY_LOCK: numpy parses them with ast,
    which CPython 3.11 before 3.11.8 can fail when two threads do it at once (this suite's reader threads did)."""
    from twotower.io import NPY_LOCK

    opened = IndexStore.open(tmp_path / "idx")  # its BM25 loads on first use
    for open_part in (lambda: IndexStore.open(tmp_path / "idx").close(), lambda: opened.bm25):
        done = threading.Event()
        thread = threading.Thread(target=lambda: (open_part(), done.set()))
        with NPY_LOCK:
            thread.start()
            assert not done.wait(0.5)  # held up by the lock
        assert done.wait(30)
        thread.join()


def test_readers_see_whole_versions_during_writes(store, tmp_path):
    root = tmp_path / "idx"
    seen: set[int] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                s = IndexStore.open(root)
                n = len(s)
                # every part of the version agrees: ids, vectors, FAISS index
                assert s.vectors.shape[0] == n == s.faiss_index.ntotal == len(s.doc_ids)
                _, rows = s.search(np.asarray(s.vectors[[n - 1]]), k=1)
                assert rows[0, 0] == n - 1
                seen.add(n)
                s.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    current = store
    for i in range(6):
        current = current.add(_docs([f"w{i}"], seed=100 + i), show_progress=False)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert seen <= set(range(50, 57)) and seen
    # the old snapshot still reads: an open store holds its version (index.versions.Lease), so no write collected it
    assert store.document(3)["_id"] == "d3"
    assert sorted(p.name for p in (root / "versions").iterdir()) == ["v000001", "v000005", "v000006", "v000007"]
    store.close()  # let go: the next write collects it
    current = current.add(_docs(["w6"], seed=106), show_progress=False)
    assert len(list((root / "versions").iterdir())) == 3  # current + 2 kept


def test_text_build_add_search(tiny_beir, tiny_bert_dir, tmp_path):
    from twotower.retrieval.indexing import EncodeConfig, add_documents, build_index
    from twotower.retrieval.searcher import Searcher

    cfg = EncodeConfig(precision="fp32", show_progress=False)
    out = tmp_path / "tidx"
    s = build_index(tiny_beir, out, model=str(tiny_bert_dir), spec=IndexSpec(kind="hnsw", hnsw_m=8, bm25=True), cfg=cfg)
    assert s.manifest["model"]["name"] == str(tiny_bert_dir) and s.dim == 32 and s.manifest["factory"] == "HNSW8"
    searcher = Searcher(out)
    hits = searcher.search("green tea leaves", k=3, mode="bm25")
    assert hits[0].doc_id == "d5" and hits[0].title == "Tea"
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "d7", "title": "Kombucha", "text": "Kombucha is fermented sweet tea."}) + "\n")
    add_documents(out, new, cfg=cfg)
    assert len(searcher.store) == 6  # still the old version until refreshed
    assert searcher.refresh() and len(searcher.store) == 7
    assert searcher.search("kombucha fermented", k=1, mode="bm25")[0].doc_id == "d7"
    dense = searcher.search("Kombucha Kombucha is fermented sweet tea.", k=7, mode="dense", ef_search=16)
    assert {h.doc_id for h in dense} == {f"d{i}" for i in range(1, 8)}
    hybrid = searcher.search("fermented tea", k=3, mode="hybrid")
    assert len(hybrid) == 3 and all(0.0 <= h.score <= 1.0 for h in hybrid)
    with pytest.raises(Exception, match="already in the index"):
        add_documents(out, new, cfg=cfg)


def test_cli_index_build_add_search_eval(tiny_beir, tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    runner = CliRunner()
    out = tmp_path / "cidx"
    res = runner.invoke(app, ["index", "build", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--out",
                              str(out), "--kind", "flat", "--bm25", "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "version v000001, 6 documents, 6 vectors of 32 dims, Flat, BM25" in res.output
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "d9", "title": "Kombucha", "text": "Kombucha is fermented tea."}) + "\n")
    res = runner.invoke(app, ["index", "add", "--index", str(out), "--docs", str(new), "--no-progress"])
    assert res.exit_code == 0 and "version v000002, 7 documents" in res.output, res.output
    res = runner.invoke(app, ["index", "add", "--index", str(out), "--docs", str(new), "--no-progress"])
    assert res.exit_code == 2
    assert "1 document id(s) are already in the index" in res.output and "--replace" in res.output
    res = runner.invoke(app, ["search", "--index", str(out), "kombucha", "-k", "2", "--mode", "bm25", "--json"])
    assert res.exit_code == 0, res.output
    first = json.loads(res.output.splitlines()[0])
    assert first["id"] == "d9" and first["title"] == "Kombucha" and first["rank"] == 1
    res = runner.invoke(app, ["search", "--index", str(out), "x", "--mode", "nope"])
    assert res.exit_code == 2 and "unknown search mode 'nope'" in res.output
    evaluate = ["eval", "--data", str(tiny_beir), "--retriever", "hybrid", "--index", str(out), "--out",
                str(tmp_path / "e.json"), "--no-progress"]
    res = runner.invoke(app, evaluate)  # the index holds d9, the corpus does not
    assert res.exit_code == 2 and "built from a different corpus" in res.output, res.output
    res = runner.invoke(app, ["index", "remove", "--index", str(out), "d9"])
    assert res.exit_code == 0 and "version v000003, 6 documents" in res.output, res.output
    res = runner.invoke(app, evaluate)
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "e.json").read_text())["num_queries"] == 3


def test_searcher_encodes_queries_at_its_precision(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch):
    """The torch query path runs at the Searcher's precision, and ``eval --index --precision`` passes it on."""
    from twotower.encoders.towers import EncodeOptions
    from twotower.evaluation.pipeline import EvalConfig, run_eval
    from twotower.retrieval import searcher as searcher_mod
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    out = tmp_path / "pidx"
    build_index(tiny_beir, out, model=str(tiny_bert_dir), cfg=EncodeConfig(precision="fp32", show_progress=False))
    texts = ["green tea leaves", "a longer query about fermented drinks and their history"]
    for precision in ("fp32", "bf16"):
        s = Searcher(out, precision=precision)
        want = s.encoder.encode_queries(texts, EncodeOptions(precision=precision, show_progress=False))
        np.testing.assert_array_equal(s.encode_queries(texts), want)
    assert not np.array_equal(Searcher(out, precision="fp32").encode_queries(texts),
                              Searcher(out, precision="bf16").encode_queries(texts))

    made = []
    real = searcher_mod.Searcher

    def recording(*args, **kwargs):
        made.append(kwargs.get("precision"))
        return real(*args, **kwargs)

    monkeypatch.setattr(searcher_mod, "Searcher", recording)
    run_eval(EvalConfig(data=tiny_beir, split="test", retriever="dense", index=out, precision="bf16",
                        show_progress=False))
    assert made == ["bf16"]


def test_both_backends_implement_the_store_protocol(store):
    """The local and the Milvus store offer every method of ``store_protocol.Store``; the local one's attributes too."""
    from twotower.retrieval.milvus.store import MilvusStore
    from twotower.retrieval.store_protocol import Store

    methods = [name for name, value in vars(Store).items()
               if name == "__len__" or (not name.startswith("_") and callable(getattr(value, "__func__", value))
                                        or isinstance(value, property))]
    assert {"build", "open", "add", "remove", "search", "documents", "info", "version"} <= set(methods)
    for cls in (IndexStore, MilvusStore):
        assert [m for m in methods if not hasattr(cls, m)] == [], cls
    assert all(hasattr(store, name) for name in Store.__annotations__)
    assert store.info()["backend"] == "faiss" and store.info()["live_version"] == store.version
