"""Issue #71 item 15 on every surface: one id repeated within one write. The LangChain and LlamaIndex stores keep the
last text (tests/test_integrations.py: their upsert contract); everywhere else -- ``Index.build`` / ``index.add``
(either ``replace``), ``index.update`` / ``delete``, ``twotower index add --docs`` and ``POST /documents`` -- the write
is refused naming the id, nothing is written, and the live version stays. The same on the Milvus backend."""

from __future__ import annotations

import json
import shutil

import pytest

import twotower as tt
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, flat_index, serve_client, write_beir
from surfaces import cli_message

KEY = "0123456789abcdef0123"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("repeated")
    return flat_index(write_beir(root / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS), tiny_bert_dir, root / "index")


@pytest.fixture()
def index(built, tmp_path):
    shutil.copytree(built, tmp_path / "index")
    return tt.Index.open(tmp_path / "index", precision="fp32")


def _python_writes(index):
    return (
        lambda: index.add(["one", "two"], ids=["x", "x"], metadatas=[{"v": 1}, {"v": 2}]),
        lambda: index.add(["one", "two"], ids=["d1", "d1"], replace=True),
        lambda: index.add([{"_id": "x", "text": "one"}, {"_id": "x", "text": "two"}]),
        lambda: index.add([tt.Document("x", "", "one"), tt.Document("x", "", "two")], replace=True),
    )


def test_python_add_refuses_an_id_given_twice_naming_it(index):
    version, n = index.info()["live_version"], len(index)
    for call in _python_writes(index):
        with pytest.raises(tt.TwoTowerError, match="duplicate document id '(x|d1)'"):
            call()
    with pytest.raises(tt.TwoTowerError, match="duplicate document id 'doc-"):  # the same text: the same id
        index.add(["same text", "same text"])
    with pytest.raises(tt.TwoTowerError, match="'d2' is given more than once"):
        index.update(["d2", "d2"], metadata=[{"v": 1}, {"v": 2}])
    with pytest.raises(tt.TwoTowerError, match="'d3' is given more than once"):
        index.delete(["d3", "d3"])
    assert index.info()["live_version"] == version and len(index) == n
    assert index.get(["d1"])[0].text == TINY_CORPUS[0]["text"] and "x" not in index.list(limit=100).ids


def test_build_refuses_an_id_given_twice(tmp_path, tiny_bert_dir):
    with pytest.raises(tt.TwoTowerError, match="duplicate document id 'x'"):
        tt.Index.build(tmp_path / "i", ["one", "two"], ids=["x", "x"], encoder=str(tiny_bert_dir),
                       show_progress=False)
    assert not (tmp_path / "i").exists()


@pytest.mark.parametrize("replace", [False, True])
def test_cli_add_refuses_an_id_given_twice_naming_it(index, tmp_path, replace):
    version = index.info()["live_version"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"_id": "d1", "text": "first"}\n{"_id": "d1", "text": "second"}\n')
    printed = cli_message("index", "add", "--index", index.path, "--docs", docs, *(["--replace"] if replace else []))
    assert "duplicate id 'd1' (first seen on line 1)" in printed
    assert tt.Index.open(index.path).info()["live_version"] == version


def test_http_add_refuses_an_id_given_twice_naming_it(index):
    version, n = index.info()["live_version"], len(index)
    client = serve_client(index.path, KEY)
    for replace in (False, True):
        res = client.post("/documents", json={"documents": [{"_id": "x", "text": "one"}, {"_id": "x", "text": "two"}],
                                              "replace": replace}, headers={"X-API-Key": KEY})
        assert res.status_code == 422 and "'x'" in res.json()["detail"], res.text
        res = client.post("/documents", json={"documents": ["same text", "same text"], "replace": replace},
                          headers={"X-API-Key": KEY})
        assert res.status_code == 422 and "'doc-" in res.json()["detail"], res.text
    assert json.loads(client.get("/info", headers={"X-API-Key": KEY}).text)["documents"] == n
    reopened = tt.Index.open(index.path)
    assert reopened.info()["live_version"] == version and len(reopened) == n


def test_milvus_add_refuses_an_id_given_twice_naming_it(tmp_path, tiny_bert_dir):
    pytest.importorskip("pymilvus")
    pytest.importorskip("milvus_lite")
    where = {"uri": str(tmp_path / "m.db"), "collection": "repeated"}
    backend = {"backend": tt.Milvus(**where)} if hasattr(tt, "Milvus") else {"backend": "milvus", **where}
    index = tt.Index.build(tmp_path / "m", ["tea", "coffee"], ids=["a", "b"], encoder=str(tiny_bert_dir),
                           precision="fp32", show_progress=False, **backend)
    for call in _python_writes(index):
        with pytest.raises(tt.TwoTowerError, match="duplicate document id '(x|d1)'"):
            call()
    with pytest.raises(tt.TwoTowerError, match="'a' is given more than once"):
        index.update(["a", "a"], metadata=[{"v": 1}, {"v": 2}])
    with pytest.raises(tt.TwoTowerError, match="'b' is given more than once"):
        index.delete(["b", "b"])
    assert len(index) == 2 and sorted(index.list(limit=10).ids) == ["a", "b"]
