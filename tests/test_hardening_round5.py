"""Hardening, round 5 (issue #55), local index: filters and metadata under hostile input on every surface (numbers
beyond float range, the filter limits checked before any work, filter files, the types the API does not expect),
encoder options given with an index, metric spellings, sizes no model can honour, quiet progress from Python.
The Milvus side is tests/test_milvus_hardening.py; the behaviours plausible bugs slipped past are
tests/test_hardening_round5_search.py."""

from __future__ import annotations

import json
import os
import signal
import stat

import numpy as np
import pytest
from typer.testing import CliRunner

import twotower as tt
from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, flat_index, serve_client, write_beir
from surfaces import cli_message
from twotower.cli import app
from twotower.retrieval.filters.checks import MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_FILTER_VALUES

KEY = "0123456789abcdef0123"
HUGE = int("9" * 400)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert_dir):
    """(BEIR folder, index folder) of the tiny corpus with metadata, built once."""
    root = tmp_path_factory.mktemp("round5")
    corpus = [dict(d, year=2018 + i, tag=["tea", "coffee"][i % 2]) for i, d in enumerate(TINY_CORPUS)]
    data = write_beir(root / "tiny", corpus, TINY_QUERIES, TINY_QRELS)
    return data, flat_index(data, tiny_bert_dir, root / "index")


@pytest.fixture()
def index(built, tmp_path):
    import shutil

    shutil.copytree(built[1], tmp_path / "index")
    return tt.Index.open(tmp_path / "index", precision="fp32")


def _nested(levels: int) -> dict:
    flt: dict = {"year": 2020}
    for _ in range(levels):
        flt = {"$and": [flt]}
    return flt


# ------------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize("flt, field", [({"year": HUGE}, "year.$eq"), ({"year": {"$gt": -HUGE}}, "year.$gt"),
                                        ({"$or": [{"tag": "tea"}, {"year": {"$in": [1, HUGE]}}]}, "year.$in")])
def test_numbers_beyond_float_range_are_named_on_every_surface(built, index, flt, field):
    with pytest.raises(tt.DataError, match="beyond float range") as err:
        index.search("tea", filter=flt)
    assert err.value.field == field
    printed = cli_message("search", "tea", "--index", built[1], "--filter", json.dumps(flt))
    assert f"field '{field}'" in printed and "beyond float range" in printed
    client = serve_client(built[1], KEY)
    answer = client.post("/search", json={"query": "tea", "filter": flt})
    assert answer.status_code == 422 and field in answer.text and "beyond float range" in answer.text, answer.text
    # more digits than Python reads as a number: the filter as JSON text, and the HTTP body
    with pytest.raises(tt.DataError, match="4,300 digits"):
        tt.parse_filter('{"year": ' + "9" * 5000 + "}")
    answer = client.post("/search", content=b'{"query": "tea", "filter": {"year": ' + b"9" * 5000 + b"}}",
                         headers={"content-type": "application/json"})  # the body cannot be read: 400, said so
    assert answer.status_code == 400 and "4,300 digits" in answer.text, answer.text


def test_filter_limits_hold_at_the_limit_and_refuse_past_it(index):
    wide = {"$or": [{"year": 3000 + i} for i in range(MAX_FILTER_CONDITIONS - 1)] + [{"year": 2019}]}
    many = {"year": {"$in": list(range(5000, 5000 + MAX_FILTER_VALUES - 1)) + [2019]}}
    # at the limits: answered (year 2019 is d2's, 2020 d3's)
    assert [h.id for h in index.search("tea", k=5, filter=_nested(MAX_FILTER_DEPTH))] == ["d3"]
    for flt in (wide, many):
        assert [h.id for h in index.search("tea", k=5, filter=flt)] == ["d2"]
    for flt, field, words in ((_nested(MAX_FILTER_DEPTH + 1), "$and[0]", "deeper than 32"),
                              (_nested(3000), "$and[0]", "deeper than 32"),  # never a RecursionError
                              ({"$or": wide["$or"] + [{"year": 1}]}, "$or", "1,024"),
                              ({"$or": [{"a": 1, "b": {"$gt": 1, "$lt": 9}}] * 400}, None, "1,024 conditions"),
                              ({"year": {"$in": many["year"]["$in"] + [1]}}, "year.$in", "4,096"),
                              ({"$or": [{"a": {"$in": [0] * 3000}}, {"b": {"$nin": [0] * 3000}}]}, None, "4,096")):
        with pytest.raises(tt.DataError, match=words) as err:
            index.search("tea", filter=flt)
        assert field is None or err.value.field == field
    with pytest.raises(tt.DataError, match="nested too deep"):  # JSON text past Python's own reader
        tt.parse_filter('{"$and": [' * 3000 + '{"a": 1}' + "]}" * 3000)


def test_filter_limits_are_checked_before_any_work(monkeypatch, built):
    """Over the limits, parse_filter refuses before it builds a condition; the service, before it searches."""
    from twotower.retrieval.filters import parse as filters

    def no_work(*args, **kwargs):
        raise AssertionError("the filter was parsed before its limits were checked")

    monkeypatch.setattr(filters, "_parse", no_work)
    for flt in (_nested(600), {"$or": [{"x": i} for i in range(175_000)]}, {"x": {"$in": list(range(10_000))}},
                {"x": HUGE}, {"x": None}, {"x\ud800": 1}):
        with pytest.raises(tt.DataError):
            tt.parse_filter(flt)
    monkeypatch.undo()
    client = serve_client(built[1], KEY)
    deep = b'{"query": "tea", "filter": ' + b'{"$and": [' * 600 + b'{"x": 1}' + b"]}" * 600 + b"}"
    answer = client.post("/search", content=deep, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "32 levels" in answer.text and "not JSON" not in answer.text, answer.text
    body = {"query": "tea", "filter": {"$or": [{"x": i} for i in range(175_000)]}}
    answer = client.post("/search", json=body)
    assert answer.status_code == 422 and "1,024" in answer.text, answer.text[:300]


def test_filter_files_are_regular_bounded_files(built, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text('{"tag": "' + "x" * (1024 * 1024) + '"}')
    old = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("reading the filter file blocked"))
    signal.alarm(30)
    try:
        for path, words in ((fifo, "FIFO"), ("/dev/zero", "character device"), (big, "MiB")):
            assert words in cli_message("search", "tea", "--index", built[1], "--filter", f"@{path}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    plain, bom = tmp_path / "plain.json", tmp_path / "bom.json"
    plain.write_text('{"tag": "tea"}')
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    runner = CliRunner()
    outs = [runner.invoke(app, ["search", "tea", "--index", str(built[1]), "--json", "--filter", f"@{p}"])
            for p in (plain, bom)]
    assert all(r.exit_code == 0 for r in outs), outs[1].output
    assert outs[0].output == outs[1].output and '"d' in outs[0].output


# ------------------------------------------------------------------------------------------- documents


def test_document_metadata_none_and_wrong_types(index):
    assert tt.Document("d1", "", "x", None).metadata == {}
    with pytest.raises(tt.DataError, match="metadata must be a dict") as err:
        tt.Document("d1", "", "x", [("a", 1)])
    assert err.value.field == "metadata"
    index.add([tt.Document("n1", "", "green tea", None)])
    assert index.documents(["n1"])[0]["text"] == "green tea"


def test_a_document_keyed_by_another_id_is_refused(index):
    with pytest.raises(tt.DataError, match="'idY' is not its key 'keyX'"):
        index.add({"keyX": tt.Document("idY", "", "text")})
    assert not {"keyX", "idY"} & set(index.store.doc_ids)
    index.add({"keyZ": tt.Document("keyZ", "", "text")})
    assert "keyZ" in index.store.doc_ids


def test_generators_and_sets_of_strings(index):
    texts = ["first new text", "second new text"]
    index.add(t for t in texts)
    assert index.added_ids == tt.document_ids(texts)
    index.add({"third new text", "fourth new text"})
    assert sorted(index.added_ids) == sorted(tt.document_ids(["third new text", "fourth new text"]))
    with pytest.raises(tt.DataError, match="a set has no order"):
        index.add({"fifth new text"}, ids=["x5"])


def test_metadata_key_with_a_lone_surrogate_is_named(built, index):
    with pytest.raises(tt.DataError, match="lone surrogate") as err:
        index.add([{"_id": "s1", "text": "x", "ok\ud800": 1}])
    assert err.value.field == "ok\\ud800" and "ok\\ud800" in str(err.value)
    str(err.value).encode("utf-8")
    client = serve_client(built[1], KEY)
    body = b'{"documents": [{"_id": "s1", "text": "x", "metadata": {"ok\\ud800": 1}}]}'
    answer = client.post("/documents", content=body, headers={"X-API-Key": KEY, "content-type": "application/json"})
    assert answer.status_code == 422 and "ok\\\\ud800" in answer.text, answer.text
    assert client.get("/documents/s1").status_code == 404


def test_numpy_scalars_are_named_as_numpy(index):
    with pytest.raises(tt.DataError, match=r"numpy\.int64 .*\.item\(\)"):
        index.add([{"_id": "np1", "text": "x", "n": np.int64(3)}])
    with pytest.raises(tt.DataError, match=r"numpy\.bool"):
        index.add([{"_id": "np2", "text": "x", "n": np.bool_(True)}])
    with pytest.raises(tt.DataError, match=r"numpy\.float32") as err:
        index.search("tea", filter={"year": {"$gt": np.float32(1.0)}})
    assert err.value.field == "year.$gt"
    assert len(index.search("tea", k=np.int64(3))) == 3  # a numpy count is a number


# ------------------------------------------------------------------------- options, metrics and sizes


@pytest.mark.parametrize("option", [["--pooling", "cls"], ["--query-max-length", "8"], ["--doc-max-length", "8"],
                                    ["--batch-size", "4"], ["--compile"], ["--language", "de"]])
def test_eval_with_an_index_refuses_encoder_options_it_would_ignore(built, option):
    printed = cli_message("eval", "--data", built[0], "--index", built[1], *option, "--no-progress")
    assert option[0] in printed


def test_python_evaluate_with_an_index_refuses_them_too(built):
    index = tt.Index.open(built[1], precision="fp32")
    with pytest.raises(tt.TwoTowerError, match="pooling"):
        tt.evaluate(index, built[0], pooling="cls")
    assert tt.evaluate(index, built[0], metrics=["ndcg@10"]).metrics  # without them it runs


def test_metric_spellings_become_one_key(built):
    run, qrels = {"q1": {"d1": 2.0, "d2": 1.0}}, {"q1": {"d2": 1}}
    for name in ("NDCG@010", "ndcg_cut_10", "ndcg.10", " nDCG@10 "):
        assert set(tt.score_run(run, qrels, [name])) == {"ndcg@10"}
    assert set(tt.score_run(run, qrels, ["P@01", "Recall_0100"], per_query=True)) == {"p@1", "recall@100"}
    assert set(tt.evaluate("bm25", built[0], metrics=["NDCG@010", "MRR@010"]).metrics) == {"ndcg@10", "mrr@10"}


def test_sizes_no_model_can_honour_are_refused_before_encoding(built, tmp_path, tiny_bert_dir, monkeypatch):
    from twotower.retrieval import indexing

    def no_encoding(*args, **kwargs):
        raise AssertionError("documents encoded before the sizes were checked")

    monkeypatch.setattr(indexing, "encode_new_docs", no_encoding)
    for options, words in (({"multivector": 2, "project": 33}, "wider than the model's 32"),
                           ({"multivector": 129}, "at most 128")):
        with pytest.raises(tt.TwoTowerError, match=words):
            tt.Index.build(tmp_path / "big", built[0], encoder=str(tiny_bert_dir), precision="fp32",
                           show_progress=False, **options)
        assert not (tmp_path / "big").exists()


def test_python_calls_print_no_bar_for_small_work(tmp_path, tiny_bert_dir, capfd):
    from twotower.checks import reset_names, use_cli_names
    from twotower.progress import PYTHON_DELAY_S, delay

    capfd.readouterr()
    index = tt.Index.build(tmp_path / "two", ["green tea", "black coffee"], encoder=str(tiny_bert_dir),
                           precision="fp32", bm25=True)  # show_progress left at its default (True)
    index.add(["more tea"], show_progress=True)
    tt.evaluate("bm25", write_beir(tmp_path / "d", TINY_CORPUS, TINY_QUERIES, TINY_QRELS))
    out, err = capfd.readouterr()
    assert "%|" not in out + err and "it/s" not in err, err
    assert delay() == PYTHON_DELAY_S > 0
    token = use_cli_names()
    try:
        assert delay() == 0.0  # the command line shows its bars at once
    finally:
        reset_names(token)
