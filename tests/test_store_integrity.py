"""Index store hardening: corrupt vectors caught on read and never blessed by a write, the corpus an index
was built from checked by ``eval --index``, absolute model paths, options checked before encoding, lock
waits announced, approximate search flagged in eval."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir
from typer.testing import CliRunner

from twotower.errors import DataError
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs

MODEL = {"name": "test", "path": "/nonexistent"}
DIM = 16


def _docs(ids, seed=0, dim=DIM, offsets=None):
    rng = np.random.default_rng(seed)
    n = len(ids) if offsets is None else int(offsets[-1])
    v = rng.standard_normal((n, dim)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return NewDocs(list(ids), [f"title {i}" for i in ids], [f"text about {i}" for i in ids], v, offsets)


def _flip_last_byte(path: Path) -> None:
    """Change one bit of the file's last byte: same size, different content."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture()
def store(tmp_path) -> IndexStore:
    return IndexStore.build(tmp_path / "idx", _docs([f"d{i}" for i in range(50)]), model=MODEL, show_progress=False)


# ---- integrity ----------------------------------------------------------------------------------


def test_flipped_vector_byte_is_caught_on_read(store, tmp_path):
    vec = store.dir / "vectors.npy"
    _flip_last_byte(vec)
    opened = IndexStore.open(tmp_path / "idx")  # sizes match: opening stays cheap
    with pytest.raises(DataError) as err:
        opened.vectors  # noqa: B018 - the read is the test
    assert str(err.value).startswith(f"{vec}: fails its sha256 checksum")
    assert "rebuild" in str(err.value)
    with pytest.raises(DataError, match="vectors.npy: fails its sha256 checksum"):
        opened.doc_vectors(3)


def test_flipped_multivector_byte_is_caught_by_search(tmp_path):
    offsets = np.array([0, 2, 5, 6, 8])
    s = IndexStore.build(tmp_path / "mv", _docs(["a", "b", "c", "d"], offsets=offsets), model=MODEL, multivector=3,
                         show_progress=False)
    q = np.asarray(s.vectors[[0]])
    assert IndexStore.open(tmp_path / "mv").search(q, k=2)[1][0, 0] == 0  # intact: searches
    _flip_last_byte(s.dir / "vectors.npy")
    with pytest.raises(DataError, match="vectors.npy: fails its sha256 checksum"):
        IndexStore.open(tmp_path / "mv").search(q, k=2)


def test_flipped_faiss_byte_is_caught_by_search(store, tmp_path):
    _flip_last_byte(store.dir / "faiss.index")
    with pytest.raises(DataError, match="faiss.index: fails its sha256 checksum"):
        IndexStore.open(tmp_path / "idx").search(np.zeros((1, DIM), np.float32), k=1)


@pytest.mark.parametrize("name", ["vectors.npy", "faiss.index", "docs.jsonl"])
def test_writes_refuse_to_bless_corrupt_files(store, tmp_path, name):
    root = tmp_path / "idx"
    path = store.dir / name
    _flip_last_byte(path)
    live = IndexStore.open(root)
    for write in (lambda: live.add(_docs(["new"], seed=3), show_progress=False),
                  lambda: live.remove(["d1"], show_progress=False),
                  lambda: live.add(_docs(["d2"], seed=3), replace=True, show_progress=False)):
        with pytest.raises(DataError) as err:
            write()
        msg = str(err.value)
        assert msg.startswith(f"{path}: fails its sha256 checksum")
        assert "nothing was written" in msg and "rebuild" in msg
    assert (root / "CURRENT").read_text().strip() == "v000001"
    assert sorted(p.name for p in (root / "versions").iterdir()) == ["v000001"]
    # the corrupt file was not re-checksummed: the manifest still holds the digest of the good bytes
    _flip_last_byte(path)
    IndexStore.open(root, verify=True)


def test_cli_index_add_refuses_corrupt_vectors(tiny_beir, tiny_bert_dir, tmp_path):
    from twotower.cli import app

    runner = CliRunner()
    out = tmp_path / "cidx"
    res = runner.invoke(app, ["index", "build", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--out",
                              str(out), "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    vec = out / "versions" / "v000001" / "vectors.npy"
    _flip_last_byte(vec)
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "d9", "title": "Kombucha", "text": "Kombucha is fermented tea."}) + "\n")
    res = runner.invoke(app, ["index", "add", "--index", str(out), "--docs", str(new), "--no-progress"])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert "vectors.npy: fails its sha256 checksum" in flat and "nothing was written" in flat
    res = runner.invoke(app, ["index", "remove", "--index", str(out), "d1"])
    assert res.exit_code == 2 and "vectors.npy: fails its sha256 checksum" in " ".join(res.output.split())
    assert (out / "CURRENT").read_text().strip() == "v000001"


# ---- the corpus an index was built from ---------------------------------------------------------


def _eval(data, index, **kw):
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    return run_eval(EvalConfig(data=data, split="test", retriever=kw.pop("retriever", "dense"), index=index,
                               precision="fp32", show_progress=False, **kw))


def test_eval_refuses_an_index_of_another_corpus(tiny_beir, tiny_bert_dir, tmp_path):
    from twotower.errors import TwoTowerError
    from twotower.retrieval.indexing import EncodeConfig, add_documents, build_index

    cfg = EncodeConfig(precision="fp32", show_progress=False)
    out = tmp_path / "fidx"
    build_index(tiny_beir, out, model=str(tiny_bert_dir), spec=IndexSpec(bm25=True), cfg=cfg)
    result = _eval(tiny_beir, out)
    assert result.model == str(tiny_bert_dir)  # the index's model, not the default's name
    assert result.num_queries == 3

    edited = [dict(d) for d in TINY_CORPUS]
    edited[2]["text"] = "Python is a snake."
    other = write_beir(tmp_path / "edited", edited, TINY_QUERIES, TINY_QRELS)
    for retriever in ("dense", "bm25", "hybrid"):
        with pytest.raises(TwoTowerError) as err:
            _eval(other, out, retriever=retriever)
        msg = str(err.value)
        assert msg.startswith(f"{out}: built from a different corpus than {other / 'corpus.jsonl'}")
        assert "1 document(s) differ in title or text (e.g. 'd3')" in msg
        # run_eval called from Python: the rebuild and the way out in Python's terms (the CLI's: tests/test_store.py)
        assert f"tt.Index.build(path, '{other}')" in msg and "without the stored index (retriever)" in msg
        assert "--" not in msg

    extra = {"_id": "d7", "title": "Kombucha", "text": "Kombucha is fermented sweet tea."}
    grown = write_beir(tmp_path / "grown", [*TINY_CORPUS, extra], TINY_QUERIES, TINY_QRELS)
    with pytest.raises(TwoTowerError, match=r"1 document\(s\) of the corpus are not in the index \(e\.g\. 'd7'\)"):
        _eval(grown, out)
    # an index grown by 'index add' remembers the grown corpus, and forgets it again after 'index remove'
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps(extra) + "\n")
    add_documents(out, new, cfg=cfg)
    assert _eval(grown, out).num_queries == 3
    with pytest.raises(TwoTowerError, match=r"1 document\(s\) of the index are not in the corpus \(e\.g\. 'd7'\)"):
        _eval(tiny_beir, out)
    IndexStore.open(out).remove(["d7"], show_progress=False)
    assert _eval(tiny_beir, out).num_queries == 3
    # the order of the corpus lines does not matter
    assert _eval(write_beir(tmp_path / "reordered", TINY_CORPUS[::-1], TINY_QUERIES, TINY_QRELS), out).num_queries == 3
    # queries encoded by another model than the index's: refused, naming the index's model (issue 35: scores of
    # another encoder's vectors were reported under the index's model name, with a warning)
    from conftest import copy_without_dropout

    other_model = copy_without_dropout(tiny_bert_dir, tmp_path / "other-model")
    with pytest.raises(TwoTowerError, match=f"its documents were encoded by {tiny_bert_dir}"):
        _eval(tiny_beir, out, model=str(other_model))
    assert not [w for w in _eval(tiny_beir, out, model=str(tiny_bert_dir)).warnings if "queries are encoded" in w]
    # the fingerprint kept up to date by add/remove equals a fresh build's
    fresh = build_index(tiny_beir, tmp_path / "fresh", model=str(tiny_bert_dir), cfg=cfg)
    assert IndexStore.open(out).manifest["corpus"] == fresh.manifest["corpus"]
    assert IndexStore.open(out).manifest["corpus"]["scheme"] == "sum-sha256-v1"


def test_eval_checks_indexes_written_before_fingerprints(tiny_beir, tiny_bert_dir, tmp_path):
    """An index whose manifest has no corpus fingerprint is checked against its stored documents."""
    from twotower.errors import TwoTowerError
    from twotower.retrieval.indexing import EncodeConfig, build_index

    out = tmp_path / "old"
    s = build_index(tiny_beir, out, model=str(tiny_bert_dir), cfg=EncodeConfig(precision="fp32", show_progress=False))
    manifest = json.loads((s.dir / "manifest.json").read_text())
    del manifest["corpus"]
    (s.dir / "manifest.json").write_text(json.dumps(manifest))
    assert _eval(tiny_beir, out).num_queries == 3
    edited = [dict(d) for d in TINY_CORPUS]
    edited[0]["title"] = "Felines"
    with pytest.raises(TwoTowerError, match=r"1 document\(s\) differ in title or text \(e\.g\. 'd1'\)"):
        _eval(write_beir(tmp_path / "edited", edited, TINY_QUERIES, TINY_QRELS), out)


def test_eval_over_ann_index_warns_once_that_search_is_approximate(tiny_beir, tiny_bert_dir, tmp_path):
    from twotower.cli import app
    from twotower.retrieval.indexing import EncodeConfig, build_index

    cfg = EncodeConfig(precision="fp32", show_progress=False)
    build_index(tiny_beir, tmp_path / "hnsw", model=str(tiny_bert_dir), spec=IndexSpec(kind="hnsw", hnsw_m=4), cfg=cfg)
    build_index(tiny_beir, tmp_path / "flat", model=str(tiny_bert_dir), cfg=cfg)
    warned = [w for w in _eval(tiny_beir, tmp_path / "hnsw").warnings if "approximate" in w]
    assert len(warned) == 1
    assert "HNSW4" in warned[0] and "kind='flat'" in warned[0] and "without the stored index (retriever)" in warned[0]
    assert not [w for w in _eval(tiny_beir, tmp_path / "flat").warnings if "approximate" in w]
    res = CliRunner().invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "dense", "--index",
                                   str(tmp_path / "hnsw"), "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert " ".join(res.output.split()).count("the search is approximate") == 1


# ---- model paths, options, half-made directories ------------------------------------------------


def test_relative_model_path_is_stored_absolute(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch):
    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher

    here = tmp_path / "here"
    elsewhere = tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(here)
    relative = os.path.relpath(tiny_bert_dir, here)
    assert not Path(relative).is_absolute()
    build_index(tiny_beir, tmp_path / "ridx", model=relative, cfg=EncodeConfig(precision="fp32", show_progress=False))
    info = IndexStore.open(tmp_path / "ridx").manifest["model"]
    assert info["path"] == str(Path(tiny_bert_dir).resolve())
    monkeypatch.chdir(elsewhere)
    hits = Searcher(tmp_path / "ridx").search("Green tea is brewed from the leaves of Camellia sinensis.", k=1)
    assert hits[0].doc_id == "d5"


@pytest.mark.parametrize("args,message", [
    (["--kind", "bogus"], "index kind 'bogus'"),
    (["--kind", "ivfpq"], "needs at least 256 vectors"),
    (["--kind", "ivf", "--nlist", "50"], "--nlist 50"),
    (["--kind", "IVF4,PQ7"], "IVF4,PQ7"),
])
def test_build_checks_options_before_encoding(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch, args, message):
    from twotower.cli import app
    from twotower.encoders.towers import DualEncoder

    def must_not_encode(*a, **k):
        raise AssertionError("encoded before checking the options")

    monkeypatch.setattr(DualEncoder, "encode_documents", must_not_encode)
    out = tmp_path / "new"
    res = CliRunner().invoke(app, ["index", "build", "--data", str(tiny_beir), "--model", str(tiny_bert_dir),
                                   "--out", str(out), "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert not out.exists()


def test_failed_first_build_leaves_no_directory(tmp_path, monkeypatch):
    from twotower.retrieval.index import kinds

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(kinds, "add_in_chunks", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        IndexStore.build(tmp_path / "new", _docs(["a", "b"]), model=MODEL, show_progress=False)
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="disk full"):
        IndexStore.build(tmp_path / "empty", _docs(["a", "b"]), model=MODEL, show_progress=False)
    assert list((tmp_path / "empty").iterdir()) == []


def test_rebuilding_over_a_non_index_is_refused_before_encoding(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch):
    from twotower.errors import TwoTowerError
    from twotower.encoders.towers import DualEncoder
    from twotower.retrieval.indexing import build_index

    monkeypatch.setattr(DualEncoder, "encode_documents", lambda *a, **k: pytest.fail("encoded"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "f.txt").write_text("x")
    with pytest.raises(TwoTowerError, match="exists and is not an index directory"):
        build_index(tiny_beir, tmp_path / "junk", model=str(tiny_bert_dir))
    (tmp_path / "file").write_text("x")
    with pytest.raises(TwoTowerError, match="not a directory"):
        build_index(tiny_beir, tmp_path / "file", model=str(tiny_bert_dir))


# ---- locks --------------------------------------------------------------------------------------


def _waits(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for the index lock")]


def test_waiting_on_the_lock_is_announced(store, tmp_path, caplog):
    root = tmp_path / "idx"
    lock = root / ".lock"
    caplog.set_level(logging.INFO)
    done = threading.Event()
    with lock.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # another writer, holding the lock
        worker = threading.Thread(target=lambda: (store.add(_docs(["w"], seed=4), show_progress=False), done.set()))
        worker.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _waits(caplog):
            time.sleep(0.05)
        assert not done.is_set()
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    worker.join(30)
    assert done.is_set()
    waits = _waits(caplog)
    assert len(waits) == 1 and str(lock) in waits[0]
    assert len(IndexStore.open(root)) == 51


_HOLD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from twotower.retrieval.index import writer
    from twotower.retrieval.store import IndexStore, NewDocs

    real = writer.fill_version

    def slow(*args, **kwargs):
        print("HOLDING", flush=True)
        time.sleep(3)
        return real(*args, **kwargs)

    writer.fill_version = slow
    v = np.ones((1, 16), np.float32) / 4
    IndexStore.open(sys.argv[1]).add(NewDocs(["h"], ["h"], ["h"], v), show_progress=False)
    """
)


def test_lock_wait_names_the_holder(store, tmp_path, caplog):
    root = tmp_path / "idx"
    caplog.set_level(logging.INFO)
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "HOLDING", proc.stderr.read()
        store.add(_docs(["mine"], seed=5), show_progress=False)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    waits = _waits(caplog)
    assert len(waits) == 1
    assert str(root / ".lock") in waits[0] and f"pid {proc.pid}" in waits[0]
    final = IndexStore.open(root)
    assert {"h", "mine"} <= set(final.row_of) and len(final) == 52
