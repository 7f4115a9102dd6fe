"""Every id the local backend accepts works on Milvus (issue #44): quotes, backslashes, brackets, unicode, 256
characters and ids shaped like filter expressions, through add, search, documents, replace and remove — against the
real Milvus Lite. Before the fix pymilvus pasted ids between single quotes unescaped: ``O'Brien`` failed to parse,
``q','d1`` matched two documents (a false "replaced") and ``x']or[id!='`` was refused."""

from __future__ import annotations

import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import twotower as tt  # noqa: E402
from conftest import TINY_CORPUS, write_beir  # noqa: E402
from twotower.data.ids import id_problem  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402

NASTY = ["O'Brien", "a\\b", "x\\", "q','d1", "x']or[id!='", 'say"hi"', '\\"', "[d1]", "d1\\'", "ü€😀-Ωμέγα", "z" * 256,
         "id==\"d1\"||id!=\"\"", "id_in[\"d1\"]", "d1\"]or[id!=\"", "%_*?", "\\\\\\"]

ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1,
              max_size=256).filter(lambda s: id_problem(s) is None)


@pytest.fixture(scope="module")
def index(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("milvus-ids")
    data = write_beir(root / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    return tt.Index.build(root / "idx", data, encoder=str(tiny_bert_dir), bm25=True, precision="fp32",
                          show_progress=False, backend="milvus", uri=str(root / "ids.db"), collection="ids")


def _round_trip(index, doc_id: str) -> None:
    n = len(index)
    word = "xylophonequux"
    index.add([{"_id": doc_id, "title": "Odd", "text": f"{word} one"}])
    assert len(index) == n + 1
    assert index.documents([doc_id]) == [{"_id": doc_id, "title": "Odd", "text": f"{word} one"}]
    assert [h.id for h in index.search(word, k=1, mode="bm25")] == [doc_id]
    assert doc_id in [h.id for h in index.search(f"{word} one", k=n + 1, mode="dense")]
    with pytest.raises(TwoTowerError, match="already in the index"):
        index.add([{"_id": doc_id, "text": "again"}])
    index.add([{"_id": doc_id, "title": "Odd", "text": f"{word} two"}], replace=True)
    assert len(index) == n + 1 and index.documents([doc_id])[0]["text"] == f"{word} two"
    index.remove([doc_id])
    assert len(index) == n and index.search(word, k=1, mode="bm25") == []
    with pytest.raises(TwoTowerError, match="not in the index"):
        index.documents([doc_id])
    index.remove([doc_id])  # the same write again: done already, a no-op (a rerun after a kill must not fail)
    assert len(index) == n
    with pytest.raises(TwoTowerError, match="1 document id\\(s\\) not in the index"):
        index.remove(["d1", doc_id])  # nothing of a refused write is applied: d1 stays
    assert len(index.documents(["d1"])) == 1  # the neighbours an unescaped id once matched are untouched


@pytest.mark.parametrize("doc_id", NASTY)
def test_odd_ids_through_every_operation(index, doc_id):
    _round_trip(index, doc_id)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc_id=ids)
@example(doc_id="q','d1")
def test_any_accepted_id_through_every_operation(index, doc_id):
    _round_trip(index, doc_id)


def test_a_replace_of_an_id_shaped_like_two_counts_one(index):
    """``q','d1`` does not exist: a replace of it adds one document; d1 and a document 'q' are left as they were."""
    from twotower.retrieval.backends import open_store
    from twotower.retrieval.store import IndexStore, IndexStoreError

    store = open_store(index.path)
    assert "q','d1" not in store.row_of and "d1" in store.row_of
    with pytest.raises(IndexStoreError, match="a milvus index, not a local one: open it with .*open_store"):
        IndexStore.open(index.path)  # the local backend does not open a Milvus folder (nor import Milvus' store)


def test_no_traceback_on_a_file_uri_nor_on_a_successful_build(tiny_bert_dir, tmp_path):
    """A plain file given as ``--uri x.db`` is named (it once printed Milvus Lite's traceback, then blamed another
    process); a build that succeeds prints no grpc "Method not implemented" tracebacks (Milvus Lite's server does not
    implement AllocTimestamp, which pymilvus asks for on each upsert)."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import subprocess_env

    data = write_beir(tmp_path / "data", TINY_CORPUS, [{"_id": "q0", "text": "tea"}], [("q0", "d5", 1)])
    (tmp_path / "x.db").write_text("not a database\n")
    twotower = str(Path(sys.executable).parent / "twotower")
    base = [twotower, "index", "build", "--data", str(data), "--model", str(tiny_bert_dir), "--bm25", "--no-progress",
            "--precision", "fp32", "--backend", "milvus"]
    bad = subprocess.run([*base, "--out", str(tmp_path / "a"), "--uri", str(tmp_path / "x.db")], capture_output=True,
                         text=True, env=subprocess_env(), timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stdout + bad.stderr, bad.stderr
    assert f"{tmp_path / 'x.db'} is a file, not a Milvus Lite database" in bad.stderr, bad.stderr
    assert (tmp_path / "x.db").read_text() == "not a database\n" and not (tmp_path / "a").exists()
    good = subprocess.run([*base, "--out", str(tmp_path / "b"), "--uri", str(tmp_path / "ok.db")], capture_output=True,
                          text=True, env=subprocess_env(), timeout=300)
    assert good.returncode == 0, good.stderr
    assert "Traceback" not in good.stdout + good.stderr and "not implemented" not in good.stderr, good.stderr
    (tmp_path / "new.jsonl").write_text('{"_id": "n\\\\1", "text": "Wombats dig."}\n')
    for args in (["add", "--docs", str(tmp_path / "new.jsonl")], ["remove", "n\\1"]):
        write = subprocess.run([twotower, "index", *args, "--index", str(tmp_path / "b")], capture_output=True,
                               text=True, env=subprocess_env(), timeout=300)
        assert write.returncode == 0, write.stderr  # pymilvus' warnings (a Lite server lacking an RPC) stay quiet
        assert "Traceback" not in write.stderr and "WARNING" not in write.stderr and "mvccTs" not in write.stderr, \
            write.stderr
    # the index's manifest naming a file where its Lite folder was: named too, when opened
    import shutil

    shutil.rmtree(tmp_path / "ok.db")
    (tmp_path / "ok.db").write_text("gone\n")
    opened = subprocess.run([twotower, "search", "tea", "--index", str(tmp_path / "b")], capture_output=True,
                            text=True, env=subprocess_env(), timeout=300)
    assert opened.returncode != 0 and "is a file, not a Milvus Lite database" in opened.stderr, opened.stderr
    assert "Traceback" not in opened.stdout + opened.stderr


def test_an_idle_milvus_lite_connection_is_not_pinged(tmp_path, monkeypatch):
    """pymilvus pings every 10 s even without calls; Milvus Lite's in-process grpc server allows one ping per 5 minutes
    and, after ~30 s idle, answered GOAWAY "too_many_pings", which grpc printed on stderr after successful operations.
    A Lite connection is opened with keepalive off; a server's pings only while a call runs, at most every 6 minutes
    (Milvus Lite's server mode is the same grpc server: issue #54)."""
    import pymilvus

    from twotower.retrieval.milvus import client as mc

    made = []
    monkeypatch.setattr(pymilvus, "MilvusClient", lambda **kwargs: made.append(kwargs) or object())
    mc.connect(str(tmp_path / "idle.db"))
    mc.connect("http://localhost:19530")
    assert made[0]["grpc_options"] == {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
    assert made[1]["grpc_options"] == {"grpc.keepalive_time_ms": 360_000, "grpc.keepalive_permit_without_calls": 0}



def test_listing_pages_past_keys_holding_quotes_and_backslashes(tmp_path):
    """Listing every id pages by the rows' keys (``<attempt>:<id>``); pymilvus' query iterator pasted the last key of
    a page between quotes unescaped, so a page ending at ``d"7`` broke the listing (issue #54): now every id comes back
    once, through ``row_of`` and the manage path alike, across pages of 1,000."""
    import numpy as np

    from twotower.retrieval.index.newdocs import NewDocs
    from twotower.retrieval.milvus.manage import matching_ids
    from twotower.retrieval.milvus.store import MilvusStore, forget_client

    odd = [f'd"{i}' if i % 3 == 0 else f"d\\{i}" if i % 3 == 1 else f"d'{i}" for i in range(2_500)]
    v = np.random.default_rng(0).standard_normal((len(odd), 8)).astype(np.float32)
    uri = str(tmp_path / "page.db")
    store = MilvusStore.build(tmp_path / "m", NewDocs(odd, [""] * len(odd), ["t"] * len(odd), v),
                              model={"name": "random"}, uri=uri, collection="page", show_progress=False)
    try:
        listed = list(store.row_of)
        assert sorted(listed) == sorted(odd) and len(listed) == len(set(listed))
        assert matching_ids(store, None) == sorted(odd, key=lambda s: s.encode("utf-8"))
    finally:
        forget_client(uri)
