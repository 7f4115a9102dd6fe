"""Writes to a Milvus index that a crash cannot half-do (issue #44), against the real Milvus Lite: a child process
adds, replaces or removes documents and SIGKILLs itself (``TWOTOWER_MILVUS_CRASH_AT``) at each batch boundary, before
and after the flush, after the lexicon and after the commit point. After every kill the index answers dense, BM25 and
hybrid queries exactly as before the write (or, killed after the commit, as after it: every added word found), and
running the same write again completes it.

Before the fix: documents were upserted before the manifest and the BM25 vocabulary were written, so a kill after a
batch left them searchable, the rerun was refused ("already in the index") and the next add reused their term ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

import twotower as tt  # noqa: E402
from conftest import TINY_CORPUS, subprocess_env, write_beir  # noqa: E402
from milvus_crash import crash, rerun  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402
from twotower.retrieval.milvus.client import forget_client  # noqa: E402

QUERIES = ["green tea leaves", "which feline purrs", "memory safe language", "zqadd3x zqadd250x", "zqnew7x",
           "zqadd400x zqnew299x"]
N_ADD, N_REPLACE, N_REMOVE = 600, 300, 200  # 600 rows: 3 upsert batches of 256



def _docs(prefix: str, start: int, n: int) -> list[dict]:
    return [{"_id": f"c{i}", "title": "Crash", "text": f"common words of the crash test zq{prefix}{i}x",
             "part": prefix, "n": i} for i in range(start, start + n)]


def _canonical(hits, k: int) -> list[tuple[float, str]]:
    """(−score, id) in order; of documents tied at the k-th score, which come is the engine's choice: left out."""
    pairs = sorted((-round(h.score, 4), h.id) for h in hits)
    return [p for p in pairs if p[0] < pairs[-1][0]] if len(pairs) == k else pairs


def _answers(path) -> dict:
    index = tt.Index.open(path, precision="fp32")
    try:
        # documents of equal score in id order: Milvus orders ties as its segments happen to lie, and marking a row
        # rewrites it (the crash-test documents repeat one sentence, so BM25 ties abound)
        out = {mode: [_canonical(hits, 10) for hits in index.search(QUERIES, k=10, mode=mode)]
               for mode in ("dense", "bm25", "hybrid")}
        # metadata is part of the write: a filter on it sees all of a write or none of it
        out["filtered"] = [_canonical(hits, 10) for hits in index.search(QUERIES, k=10, filter={"part": "new"})]
        out["count"] = len(index)
        return out
    finally:
        forget_client(index.info()["milvus"]["uri"])


def _check_after(path, *, count: int, found: dict[str, str], gone: list[str]) -> None:
    """``count`` documents; each word of ``found`` ranks its document first in BM25; ``gone`` ids are not there."""
    index = tt.Index.open(path, precision="fp32")
    try:
        assert len(index) == count
        words = list(found)
        for word, hits in zip(words, index.search(words, k=1, mode="bm25")):
            assert [h.id for h in hits] == [found[word]], word
            # the document's metadata came with it (the part its text names)
            assert hits[0].metadata == {"part": word[2:].rstrip("x").rstrip("0123456789"), "n": int(found[word][1:])}
        for doc_id in gone:
            with pytest.raises(TwoTowerError, match="not in the index"):
                index.documents([doc_id])
    finally:
        forget_client(index.info()["milvus"]["uri"])


@pytest.mark.slow  # ~2-4 minutes on 2 shared cores: 10 child processes, each killed mid-write
def test_a_kill_at_every_boundary_leaves_before_or_after_and_the_rerun_completes(tiny_bert_dir, tmp_path):
    data = write_beir(tmp_path / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    uri = str(tmp_path / "crash.db")
    index = tt.Index.build(tmp_path / "idx", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=uri, collection="crash")
    path, base = index.path, len(TINY_CORPUS)
    forget_client(uri)

    # add 600 documents (3 batches); each kill before the commit leaves the index as it was; the last one, after
    # the commit point, leaves all of it; rerunning it then is a no-op, not "already in the index"
    add = _docs("add", 0, N_ADD)
    before = _answers(path)
    for point in ("recovered", "batch:1", "batch:2", "after-flush", "blobs"):
        crash(path, "add", add, point, tmp_path)
        assert _answers(path) == before, point
    crash(path, "add", add, "committed", tmp_path)
    after = _answers(path)
    assert after != before and after["count"] == base + N_ADD
    rerun(path, "add", add)
    assert _answers(path) == after
    _check_after(path, count=base + N_ADD, found={f"zqadd{i}x": f"c{i}" for i in (0, 255, 256, 599)}, gone=[])

    # replace 300 of them (300 new rows + 300 old rows marked: 3 batches); killed before the commit every time,
    # then the rerun does the whole write
    replace = _docs("new", 0, N_REPLACE)
    before = after
    for point in ("batch:1", "before-flush"):
        crash(path, "replace", replace, point, tmp_path)
        assert _answers(path) == before, point
    rerun(path, "replace", replace)
    after = _answers(path)
    assert after["count"] == base + N_ADD and after["bm25"] != before["bm25"]
    _check_after(path, count=base + N_ADD, found={"zqnew7x": "c7", "zqnew299x": "c299", "zqadd300x": "c300"}, gone=[])
    assert tt.Index.open(path).search("zqadd7x", k=1, mode="bm25") == []  # the replaced text's word is gone
    forget_client(uri)

    # remove 200; a kill before the decision changes nothing; one while the removed rows are being marked (after the
    # decision) removed them all: readers hide the unmarked ones by key, and the next write marks them
    remove = [f"c{i}" for i in range(N_REMOVE)]
    before = after
    for point in ("registered", "blobs"):
        crash(path, "remove", remove, point, tmp_path)
        assert _answers(path) == before, point
    crash(path, "remove", remove, "marking", tmp_path)
    _check_after(path, count=base + N_ADD - N_REMOVE, found={"zqadd400x": "c400"}, gone=["c0", "c199"])
    rerun(path, "remove", remove)
    _check_after(path, count=base + N_ADD - N_REMOVE, found={"zqadd400x": "c400"}, gone=["c0", "c199"])
    assert _answers(path)["count"] == base + N_ADD - N_REMOVE

    # what the kills left behind is gone: only the live rows and the removed ones not yet swept remain; the removed
    # rows stay while a reader of the write before the removal may read them (until write R + 2 settles:
    # tests/test_milvus_snapshots.py), and the write after next sweeps them
    from twotower.retrieval.milvus.client import client_for

    def total() -> int:
        client = client_for(uri, "--uri")
        return client.query("crash", filter="", output_fields=["count(*)"])[0]["count(*)"]

    rerun(path, "add", [{"_id": "z1", "text": "last"}])
    assert total() == base + N_ADD - N_REMOVE + 1 + N_REMOVE
    rerun(path, "add", [{"_id": "z2", "text": "later"}])
    assert total() == base + N_ADD - N_REMOVE + 2
    forget_client(uri)


@pytest.mark.slow  # ~3-4 minutes on 2 shared cores: a Milvus Lite server, two serve processes, 30 writes
def test_two_serves_and_two_writers_on_one_milvus_server_agree(tiny_bert_dir, tmp_path):
    """benchmarks/milvus_consistency.py at a small size, against Milvus Lite's server mode (not skipped): after the
    interleaved writes both serves answer every query alike in dense, BM25 and hybrid, count the same documents (the
    writers' expected number), find every added word and none that was replaced or removed."""
    from pathlib import Path

    data = write_beir(tmp_path / "data", TINY_CORPUS, [{"_id": f"q{i}", "text": t} for i, t in enumerate(
        ["green tea", "feline", "memory safe language", "the cell", "replica document about"])],
        [("q0", "d5", 1), ("q1", "d1", 1), ("q2", "d4", 1), ("q3", "d6", 1), ("q4", "d2", 1)])  # all five judged
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "milvus_consistency.py"
    proc = subprocess.run([sys.executable, str(script), "--model", str(tiny_bert_dir), "--data", str(data), "--writes",
                           "15", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900,
                          env=subprocess_env(TWOTOWER_MILVUS_LOCK_SETTLE="0.05"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads((tmp_path / "out" / "milvus_consistency.json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["dense", "bm25", "hybrid"] and rows[0]["queries"] == 5
    for r in rows:
        assert r["queries_identical"] == 1.0 and r["added_words_found"] == 1.0 and r["removed_words_gone"] == 1.0, r
        assert r["count_a"] == r["count_b"] == r["count_expected"] > len(TINY_CORPUS), r
        assert r["write_errors"] == 0 and r["reads_ok"] == 1.0 and r["writes"] == 30, r


def test_a_write_stores_only_what_it_changed_in_the_lexicon(tmp_path):
    """A write keeps its lexicon change (new terms, the df of the terms it touched, the count) as delta rows, not the
    whole vocabulary again; every MAX_DELTAS-th write (or sooner, when the deltas outweigh it) stores it whole. The
    lexicon a reader loads (the whole one plus its deltas) counts exactly the documents the index holds; a reader of
    the write before still loads its own."""
    import numpy as np

    from twotower.retrieval.index.kinds import IndexSpec
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus import client as mc
    from twotower.retrieval.milvus.state import MAX_DELTAS
    from twotower.retrieval.milvus.store import MilvusStore
    from twotower.retrieval.milvus.writes import query_all

    rng = np.random.default_rng(0)

    def docs(ids, texts):
        v = rng.standard_normal((len(ids), 8)).astype(np.float32)
        return NewDocs(list(ids), [""] * len(ids), list(texts), v / np.linalg.norm(v, axis=1, keepdims=True))

    words = [f"word{i}" for i in range(400)]  # a vocabulary big enough that a one-document delta is the smaller
    uri = str(tmp_path / "lex.db")
    store = MilvusStore.build(tmp_path / "idx", docs([f"d{i}" for i in range(400)],
                                                     [f"{w} tea {words[(i * 7) % 400]}" for i, w in enumerate(words)]),
                              model={"name": "random"}, spec=IndexSpec(bm25=True), uri=uri, collection="lex",
                              show_progress=False)
    try:
        whole = []  # the writes that stored the whole lexicon
        for w in range(MAX_DELTAS + 2):
            before = store
            store = store.add(docs([f"n{w}"], [f"fresh{w} tea word3"]), show_progress=False)
            assert before.state.load_lexicon(before.head).n_docs == len(before)  # a reader of the write before
            if w % 3 == 0:
                store = store.remove([f"d{w}"], show_progress=False)
            head = store.head
            assert len(head["deltas"]) < MAX_DELTAS
            keys = [e["key"] for e in store.client.query("lex__state", filter='key like "blob:%"',
                                                         output_fields=["key"])]
            if head["deltas"]:
                assert not any(k.startswith(f"blob:{head['seq']}:") for k in keys)  # a delta, no whole lexicon
            else:
                whole.append(head["seq"])
            lexicon = MilvusStore.open(tmp_path / "idx").lexicon  # the whole one + its deltas, read back
            rows = query_all(store.client, "lex", store._visible(), [mc.SPARSE])
            df = np.zeros_like(lexicon.df)
            for r in rows:
                df[[int(j) for j in r[mc.SPARSE] if int(j) < len(df)]] += 1
            assert lexicon.n_docs == len(rows) == len(store) and np.array_equal(lexicon.df, df)
            _, found = store.bm25.search([f"fresh{w}"], 1)
            assert store.doc_ids[found[0, 0]] == f"n{w}"
        assert whole and len(whole) < MAX_DELTAS  # stored whole now and then, most writes as deltas
    finally:
        forget_client(uri)


def test_milvus_lite_is_flushed_by_a_build_and_never_by_a_write(tmp_path, monkeypatch):
    """Milvus Lite 3.2.2's flush hides the rows it flushes from queries that run meanwhile (the memtable is swapped
    out before the rows reach its segments), so writes must not flush it: its write-ahead log already holds every
    acknowledged row (the kill tests above reopen after SIGKILLs with no flush). A build flushes once, before anyone
    reads the collection, so that its rows are searched with the collection's index."""
    import numpy as np
    from pymilvus import MilvusClient

    from twotower.retrieval.index.kinds import IndexSpec
    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus import client as mc
    from twotower.retrieval.milvus.store import MilvusStore

    flushed = []
    real = MilvusClient.flush
    monkeypatch.setattr(MilvusClient, "flush", lambda self, name, **kw: (flushed.append(name), real(self, name, **kw)))
    rng = np.random.default_rng(0)

    def docs(ids):
        v = rng.standard_normal((len(ids), 8)).astype(np.float32)
        return NewDocs(list(ids), [""] * len(ids), [f"tea {d}" for d in ids], v / np.linalg.norm(v, axis=1, keepdims=True))

    uri = str(tmp_path / "flush.db")
    store = MilvusStore.build(tmp_path / "idx", docs([f"d{i}" for i in range(20)]), model={"name": "random"},
                              spec=IndexSpec(bm25=True), uri=uri, collection="flushes", show_progress=False)
    try:
        assert "flushes" in flushed
        # a Lite server at an http URI is told by its version ("milvus_lite-3.2.2"), a Milvus server is not Lite
        assert mc.is_lite(store.client, "http://127.0.0.1:19530")
        assert not mc.is_lite(type("Server", (), {"get_server_version": lambda self: "v2.3.5"})(), "http://h:19530")
        flushed.clear()
        store = store.add(docs(["n1", "n2"]), show_progress=False)
        store = store.add(docs(["n1"]), replace=True, show_progress=False)
        store = store.remove(["d3"], show_progress=False)
        assert flushed == [] and len(store) == 21
    finally:
        mc.forget_client(uri)
