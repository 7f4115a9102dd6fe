"""Writes to an index on a real Milvus server that a crash cannot half-do (issue #54), as ``test_milvus_writes.py``
checks them on Milvus Lite: a child process adds documents and SIGKILLs itself at the steps of the write
(``TWOTOWER_MILVUS_CRASH_AT``); after every kill the index answers as before the write (or, killed after the commit
point, as after it), and running the write again completes it.

On a server a write flushes once, at its end (``client.persist``): every earlier step relies on the server having
logged each row it acknowledged. This test is what says that is enough: a kill between any two steps, with no flush
in between, must still leave all of the write or none of it; and a server killed (SIGKILL) after a write was decided
but before anything of it was flushed must, restarted on its data folder, answer with all of it."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("pymilvus")

import twotower as tt  # noqa: E402
from conftest import TINY_CORPUS, write_beir  # noqa: E402
from milvus_crash import crash, rerun  # noqa: E402
from milvus_server import TEST_SETTINGS, available, milvus_server  # noqa: E402
from twotower.retrieval.milvus.client import forget_client  # noqa: E402

QUERIES = ["green tea leaves", "which feline purrs", "memory safe language", "common words 7", "crash test 250"]
N_ADD = 600  # 600 rows: 3 insert batches of 256



def _docs(start: int, n: int) -> list[dict]:
    return [{"_id": f"c{i}", "title": "Crash", "text": f"common words {i} of the crash test {i}", "part": "add",
             "n": i} for i in range(start, start + n)]


def _answers(path) -> dict:
    index = tt.Index.open(path, precision="fp32")
    try:
        out = {"dense": [[(h.id, round(h.score, 4)) for h in hits] for hits in index.search(QUERIES, k=10)],
               "filtered": [sorted(h.id for h in hits)
                            for hits in index.search(QUERIES, k=10, filter={"part": "add"})],
               "count": len(index)}
        return out
    finally:
        forget_client(index.info()["milvus"]["uri"])


@pytest.mark.slow  # ~2 minutes: 4 child processes, each killed mid-write, and a server killed and restarted
def test_a_kill_between_unflushed_steps_on_a_server_leaves_before_or_after(tiny_bert_dir, tmp_path):
    reason = available()
    if reason:
        pytest.skip(reason)
    data = write_beir(tmp_path / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    with milvus_server(tmp_path / "server", settings=TEST_SETTINGS) as running:
        server = running.uri
        index = tt.Index.build(tmp_path / "idx", data, encoder=str(tiny_bert_dir), precision="fp32",
                               show_progress=False, backend="milvus", uri=server, collection="crash")
        path, base = index.path, len(TINY_CORPUS)
        forget_client(server)

        add = _docs(0, N_ADD)
        before = _answers(path)
        # the Lite test (test_milvus_writes.py) kills at every step; here the steps no flush separates any more: rows
        # half inserted, every state row written but undecided, decided but nothing of it flushed
        for point in ("batch:3", "proposing"):
            crash(path, "add", add, point, tmp_path)
            assert _answers(path) == before, point
        crash(path, "add", add, "committed", tmp_path)
        after = _answers(path)
        assert after["count"] == base + N_ADD and all(len(f) == 10 for f in after["filtered"])
        rerun(path, "add", add)  # its digest is in the head: nothing more to do
        assert _answers(path) == after

        # a write decided and never flushed (its writer killed right after the decision), then the server killed:
        # what the server rebuilds from its log holds all of it
        more = _docs(N_ADD, 100)
        crash(path, "add", more, "committed", tmp_path)
        decided = _answers(path)
        assert decided["count"] == base + N_ADD + 100
        os.kill(running.pid, signal.SIGKILL)
        forget_client(server)
    with milvus_server(tmp_path / "server", settings=TEST_SETTINGS) as again:  # new ports; a new folder attaches
        path = tt.Index.attach(tmp_path / "idx-again", uri=again.uri, collection="crash").path
        assert _answers(path) == decided
        rerun(path, "add", more)  # found done: not "already in the index"
        assert _answers(path) == decided
        forget_client(again.uri)
