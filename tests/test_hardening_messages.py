"""Messages that say what to fix (issue #35, case 12): each bad input is named for what it is, with the file, line,
field, option or JSON field, instead of a symptom further down (a "bad score", a column count, "Extra data", a
codec error, Hugging Face's model_type error, a port error after "serving")."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, subprocess_env, write_beir

runner = CliRunner()


def invoke(*argv, **env):
    from twotower.cli import app

    res = runner.invoke(app, [str(a) for a in argv], env=env or None)
    return res, " ".join(res.output.split())


# ---- BEIR files -------------------------------------------------------------------------------------------------


def test_misspelt_qrels_header_is_named_as_a_header(tmp_path):
    from twotower.data.beir import load_qrels
    from twotower.errors import DataError

    path = tmp_path / "test.tsv"
    path.write_text("query_id\tcorpus_id\tscore\nq1\td1\t1\n")
    with pytest.raises(DataError, match=r"line 1: .*header.*'query-id\\tcorpus-id\\tscore'") as exc:
        load_qrels(path)
    assert "query_id" in str(exc.value) and "must be an integer" not in str(exc.value)


def test_cr_only_line_endings_are_named(tmp_path):
    from twotower.data.beir import load_corpus, load_qrels
    from twotower.errors import DataError

    qrels = tmp_path / "test.tsv"
    qrels.write_bytes(b"query-id\tcorpus-id\tscore\rq1\td1\t1\rq2\td2\t1\r")
    with pytest.raises(DataError, match=r"line 1: .*carriage return.*CR-only") as exc:
        load_qrels(qrels)
    assert "columns" not in str(exc.value)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"_id": "a", "text": "x"}\r{"_id": "b", "text": "y"}\r')
    with pytest.raises(DataError, match="CR-only"):
        load_corpus(corpus)
    crlf = tmp_path / "crlf.jsonl"  # Windows line endings stay fine
    crlf.write_bytes(b'{"_id": "a", "text": "x"}\r\n{"_id": "b", "text": "y"}\r\n')
    assert list(load_corpus(crlf)) == ["a", "b"]


def test_a_raw_nul_byte_is_named(tmp_path):
    from twotower.data.beir import load_corpus
    from twotower.errors import DataError

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\x00\n')
    with pytest.raises(DataError, match=r"line 2: .*NUL byte at column 26") as exc:
        load_corpus(corpus)
    assert "Extra data" not in str(exc.value)
    utf16 = tmp_path / "u16.jsonl"
    utf16.write_bytes('{"_id": "a", "text": "x"}\n'.encode("utf-16-le"))
    with pytest.raises(DataError, match="UTF-16"):
        load_corpus(utf16)


# ---- the service ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_bert_dir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from conftest import flat_index
    from twotower.serve.app import create_app

    root = tmp_path_factory.mktemp("msg")
    index = flat_index(write_beir(root / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS), tiny_bert_dir, root / "idx")
    return TestClient(create_app(index, api_key="k" * 20, precision="fp32"))


def test_text_plain_body_is_told_to_send_json(served):
    res = served.post("/search", content='{"query": "cats"}', headers={"Content-Type": "text/plain"})
    assert res.status_code == 422
    assert "application/json" in res.json()["detail"] and "text/plain" in res.json()["detail"]


@pytest.mark.parametrize("body, field", [({"query": "cats", "prf_weight": 2.0}, '"prf_depth"'),
                                         ({"query": "cats", "prf_depth": 50}, '"prf_depth" 50'),
                                         ({"query": "cats", "prf_depth": 2, "mode": "bm25"}, '"mode" bm25')])
def test_service_prf_errors_name_the_json_fields(served, body, field):
    res = served.post("/search", json=body)
    assert res.status_code in (400, 422), res.text
    assert field in res.json()["detail"] and "--prf" not in res.json()["detail"], res.text


# ---- models and homes -------------------------------------------------------------------------------------------


def test_twotower_home_that_is_a_file_is_named(tmp_path):
    home = tmp_path / "home"
    home.write_text("")
    res, out = invoke("eval", "--data", write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS),
                      "--model", "multilingual-e5-small", "--no-progress", TWOTOWER_HOME=str(home))
    assert res.exit_code == 2, out
    assert f"TWOTOWER_HOME={home}" in out and "not a directory" in out


def test_model_given_a_fit_folder_says_use_its_model(tmp_path, tiny_bert_dir):
    fit = tmp_path / "fitted"
    shutil.copytree(tiny_bert_dir, fit / "model")
    (fit / "fit.json").write_text("{}")
    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    res, out = invoke("eval", "--data", data, "--model", fit, "--no-progress")
    assert res.exit_code == 2, out
    assert f"use {fit / 'model'}" in out and "model_type" not in out


def test_model_given_an_index_folder_names_the_index_model(tmp_path, tiny_bert_dir):
    from conftest import flat_index

    data = write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    index = flat_index(data, tiny_bert_dir, tmp_path / "idx")
    res, out = invoke("eval", "--data", data, "--model", index, "--no-progress")
    assert res.exit_code == 2, out
    assert "index" in out and "--index" in out and str(tiny_bert_dir) in out and "model_type" not in out


def test_pretrain_does_not_suggest_an_option_that_does_not_exist(tmp_path, tiny_bert_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "only three words"}) + "\n")
    res, out = invoke("pretrain", "--corpus", corpus, "--out", tmp_path / "out", "--model", tiny_bert_dir,
                      "--no-progress")
    assert res.exit_code == 2, out
    assert "min_tokens" not in out
    from twotower.cli import app

    help_text = runner.invoke(app, ["pretrain", "--help"]).output
    for option in {w.strip(".,;:()'`") for w in out.split() if w.startswith(("--", "'--", "`--"))}:
        assert option in help_text, f"{option} suggested but pretrain has no such option"


# ---- serve on a busy port ---------------------------------------------------------------------------------------


def test_serve_on_a_busy_port_fails_before_saying_it_serves(tmp_path, tiny_bert_dir):
    from conftest import flat_index

    index = flat_index(write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS), tiny_bert_dir,
                       tmp_path / "idx")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "twotower.cli", "serve", "--index", str(index), "--port",
                              str(port), "--precision", "fp32", "--query-runtime", "torch"],
                             capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert res.returncode == 2, res.stdout + res.stderr
    assert "serving" not in res.stdout and f"--port {port}" in " ".join(res.stderr.split())


# ---- found by the bad-input pass ----------------------------------------------------------------------------------


def test_models_list_names_a_twotower_home_that_is_a_file(tmp_path):
    home = tmp_path / "home"
    home.write_text("")
    res, out = invoke("models", "list", TWOTOWER_HOME=str(home))
    assert res.exit_code == 2, out
    assert f"TWOTOWER_HOME={home}" in out and "Traceback" not in out


def test_utf16_file_with_a_bom_is_named_as_utf16(tmp_path):
    from twotower.data.beir import load_queries
    from twotower.errors import DataError

    path = tmp_path / "queries.jsonl"
    path.write_bytes(json.dumps({"_id": "q1", "text": "x"}).encode("utf-16"))  # with its byte-order mark
    with pytest.raises(DataError, match=r"line 1: .*\(the file is UTF-16"):
        load_queries(path)


def test_a_body_that_is_not_utf8_is_named(served):
    res = served.post("/search", content=b'{"query": "\xff"}', headers={"Content-Type": "application/json"})
    assert res.status_code == 400
    assert "UTF-8" in res.json()["detail"], res.text
