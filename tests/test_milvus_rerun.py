"""Running a write again after a crash finds it done even when other writes came after (issue #71.20).

Before the fix the rerun compared its digest with the last committed write's only: ``index add`` killed after its
decision (``TWOTOWER_MILVUS_CRASH_AT=decided``), another writer's ``index remove`` of one document, then the same
``index add`` again failed with "1000 document id(s) are already in the index … (pass --replace)". Now every attempt
records its digest (``wrote:`` rows, ``state.py``) and a rerun finds its own committed write whatever came after, as
long as what it wrote still stands; a write that later writes undid is a new write (an add of documents removed
meanwhile adds them again).

The CLI's three steps run on Milvus Lite (the child killed for real); :func:`twotower.retrieval.milvus.writes.write`'s
own check runs on the in-memory :class:`FakeMilvus` (``milvus_writers.py``), the kill a step hook that stops the write
where SIGKILL would."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pymilvus")

from conftest import TINY_CORPUS, subprocess_env, write_beir  # noqa: E402
from milvus_writers import FakeMilvus, _Store, build  # noqa: E402

from twotower.retrieval.index.errors import IndexStoreError, UnknownIdError  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus import state as st  # noqa: E402
from twotower.retrieval.milvus.state import State, visible  # noqa: E402
from twotower.retrieval.milvus.writes import query_all, write  # noqa: E402


@pytest.mark.slow  # ~20-40 s on 2 shared cores: a Milvus Lite index and one child process killed mid-write
def test_index_add_killed_after_its_decision_then_a_remove_then_the_same_add_finds_it_done(tiny_bert_dir,
                                                                                          tmp_path):
    pytest.importorskip("milvus_lite")
    from typer.testing import CliRunner

    import twotower as tt
    from twotower.cli import app
    from twotower.retrieval.milvus.client import forget_client

    data = write_beir(tmp_path / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    uri = str(tmp_path / "rerun.db")
    index = tt.Index.build(tmp_path / "idx", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                           show_progress=False, backend="milvus", uri=uri, collection="rerun")
    path, base = str(index.path), len(TINY_CORPUS)
    forget_client(uri)
    new = tmp_path / "new.jsonl"
    new.write_text("".join(json.dumps({"_id": f"n{i}", "title": "New", "text": f"zqnew{i}x words"}) + "\n"
                           for i in range(40)))
    add = [sys.executable, "-m", "twotower.cli", "index", "add", "--index", path, "--docs", str(new), "--no-progress"]

    # 1) TWOTOWER_MILVUS_CRASH_AT=decided twotower index add --docs new.jsonl
    proc = subprocess.run(add, capture_output=True, text=True, timeout=300,
                          env=subprocess_env(TWOTOWER_MILVUS_CRASH_AT="decided", TWOTOWER_MILVUS_LOCK_SETTLE="0.01"))
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    run = CliRunner().invoke
    try:
        # 2) another writer removes one document
        r = run(app, ["index", "remove", "--index", path, "d1"])
        assert r.exit_code == 0 and f"{base + 40 - 1} documents" in r.output, r.output
        # 3) the same add again: done already, nothing added, nothing refused
        r = run(app, add[3:])
        assert r.exit_code == 0, r.output
        assert "already in the index" not in r.output and f"{base + 40 - 1} documents" in r.output, r.output
        index = tt.Index.open(path, precision="fp32")
        assert len(index) == base + 40 - 1
        assert [[h.id for h in hits] for hits in index.search(["zqnew0x", "zqnew39x"], k=1, mode="bm25")] == \
            [["n0"], ["n39"]]
    finally:
        forget_client(uri)


class Killed(BaseException):
    """Where SIGKILL would stop the writer (``TWOTOWER_MILVUS_CRASH_AT``)."""


def _kill_at(point: str):
    def hook(name: str) -> None:
        if name == point:
            raise Killed(name)
    return hook


@pytest.fixture
def index(monkeypatch, tmp_path):
    """An in-memory index of 12 documents ``o0`` … ``o11``: ``(store, state, client)``."""
    monkeypatch.setenv("TWOTOWER_MILVUS_LOCK_SETTLE", "0.001")
    client = FakeMilvus()
    build(client, "fake", "c", tmp_path / "idx", np.random.default_rng(0))
    yield _Store(client, "fake", "c", tmp_path / "idx"), State(client, "fake", "c"), client
    st.set_step_hook(None)


def _docs(texts: dict[str, str]) -> NewDocs:
    vectors = np.random.default_rng(len(texts)).standard_normal((len(texts), 8)).astype(np.float32)
    return NewDocs(list(texts), [""] * len(texts), list(texts.values()), vectors / np.linalg.norm(vectors, axis=1,
                                                                                                    keepdims=True))


def _shown(client, state: State) -> dict[str, str]:
    return {r["id"]: r["text"] for r in query_all(client, "c", visible(state.head()), ["id", "text"])}


def _killed(point: str, store, **kwargs) -> None:
    st.set_step_hook(_kill_at(point))
    try:
        with pytest.raises(Killed):
            write(store, show_progress=False, **kwargs)
    finally:
        st.set_step_hook(None)


NEW = {"n1": "tea leaves", "n2": "green river stone"}


def test_an_add_killed_after_its_decision_is_found_done_after_another_write(index):
    store, state, client = index
    _killed("decided", store, docs=_docs(NEW))
    write(store, remove=["o0"], show_progress=False)  # another writer, after
    seq, shown = state.latest()[0], _shown(client, state)
    assert {d: shown[d] for d in NEW} == NEW and "o0" not in shown
    head = write(store, docs=_docs(NEW), show_progress=False)  # the rerun
    assert int(head["seq"]) == seq == state.latest()[0] and _shown(client, state) == shown  # no new write


def test_a_remove_killed_after_its_decision_is_found_done_after_another_write(index):
    store, state, client = index
    _killed("decided", store, remove=["o1", "o2"])
    write(store, docs=_docs(NEW), show_progress=False)
    seq, shown = state.latest()[0], _shown(client, state)
    assert "o1" not in shown and "o2" not in shown
    write(store, remove=["o1", "o2"], show_progress=False)  # not "2 document id(s) not in the index"
    assert state.latest()[0] == seq and _shown(client, state) == shown


def test_a_write_that_later_writes_undid_is_a_new_write(index):
    """Found done only while what it wrote still stands: the same add after its documents were removed adds them
    again; after one of them was replaced, it is refused as before; a remove of documents added back removes them."""
    store, state, client = index
    write(store, docs=_docs(NEW), show_progress=False)
    write(store, remove=list(NEW), show_progress=False)
    write(store, docs=_docs(NEW), show_progress=False)  # the same add, deliberately: not a no-op
    assert {d: _shown(client, state).get(d) for d in NEW} == NEW
    write(store, docs=_docs({"n2": "replaced text"}), replace=True, show_progress=False)
    with pytest.raises(IndexStoreError, match="2 document id"):
        write(store, docs=_docs(NEW), show_progress=False)
    assert _shown(client, state)["n2"] == "replaced text"
    write(store, remove=["o3"], show_progress=False)
    write(store, docs=_docs({"o3": "back again"}), show_progress=False)
    write(store, remove=["o3"], show_progress=False)  # the same remove again: o3 came back, so it goes again
    assert "o3" not in _shown(client, state)
    with pytest.raises(UnknownIdError, match="2 document id.*'o3', 'zz'"):  # never committed: unknown ids refused
        write(store, remove=["o3", "o4", "zz"], show_progress=False)

