"""Issue #45 (hardening, round 4): data loss in fit and train-reranker, numbers checked by one layer
(``twotower.checks``) and named as the caller knows them (``--epochs`` / ``epochs=``), options a mode ignores,
raw library exceptions from the Python API."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir

import twotower as tt
from twotower.errors import TwoTowerError

runner = CliRunner()


def invoke(*argv):
    from twotower.cli import app

    res = runner.invoke(app, [str(a) for a in argv])
    return res, " ".join(res.output.split())


@pytest.fixture()
def train_beir(tmp_path):
    queries = [{"_id": f"q{i}", "text": f"question about {d['title'] or 'cells'}"} for i, d in enumerate(TINY_CORPUS)]
    qrels = [(f"q{i}", d["_id"], 1) for i, d in enumerate(TINY_CORPUS)]
    return write_beir(tmp_path / "beir", TINY_CORPUS, queries, qrels, split="train")


# ---------------------------------------------------------------- the validation layer itself


def test_check_number_by_hand():
    from twotower.checks import MAX_COUNT, check_number, cli_names

    assert check_number(3, "k", integer=True, minimum=1) == 3
    assert check_number(2.0, "k", integer=True, minimum=1) == 2  # a whole float is a whole number
    assert check_number(0.5, "lam", minimum=0, maximum=1) == 0.5
    assert check_number(None, "dim", integer=True, optional=True) is None
    for bad, needle in ((float("nan"), "nan"), (float("inf"), "inf"), ("3", "'3'"), (True, "True"), (2.5, "2.5"),
                        (0, "0"), (MAX_COUNT + 1, str(MAX_COUNT + 1)), (None, "None")):
        with pytest.raises(TwoTowerError, match=r"^k=") as exc:
            check_number(bad, "k", integer=True, minimum=1)
        assert needle in str(exc.value) and "at least 1" in str(exc.value)
    with cli_names():
        with pytest.raises(TwoTowerError, match=r"^--top-k 0: a whole number at least 1"):
            check_number(0, "k", integer=True, minimum=1, option="--top-k")
        with pytest.raises(TwoTowerError, match=r"^--batch-size 0"):
            check_number(0, "batch_size", integer=True, minimum=1)
    with pytest.raises(TwoTowerError, match=r"^batch_size=0"):  # the CLI naming ended with its block
        check_number(0, "batch_size", integer=True, minimum=1)
    huge = 10 ** 5000
    with pytest.raises(TwoTowerError) as exc:
        check_number(huge, "k", integer=True, minimum=1)
    assert len(str(exc.value)) < 200  # a 5,000-digit number is not printed whole


# ---------------------------------------------------------------- case 1: fit into a folder of someone else's files


def test_fit_refuses_a_folder_with_a_model_and_fit_json_it_did_not_write(tmp_path, tiny_bert_dir, train_beir):
    clob = tmp_path / "clob"
    (clob / "model").mkdir(parents=True)
    (clob / "model" / "weights.txt").write_text("mine")
    (clob / "fit.json").write_text('{"mine": true}')
    res, out = invoke("fit", "--data", train_beir, "--out", clob, "--epochs", "0.1", "--no-mine", "--model",
                      tiny_bert_dir, "--no-progress", "--min-dev", "2")
    assert res.exit_code == 2, out
    assert "--out" in out and "fit.json" in out and "model" in out
    assert (clob / "model" / "weights.txt").read_text() == "mine"
    assert json.loads((clob / "fit.json").read_text()) == {"mine": True}


# ---------------------------------------------------------------- case 2: train-reranker over a user's config.json


def test_train_reranker_keeps_a_users_config_json(tmp_path, train_beir, tiny_ce_dir):
    clob = tmp_path / "clob5"
    clob.mkdir()
    (clob / "config.json").write_text('{"mine": 1}')
    res, out = invoke("train-reranker", "--data", train_beir, "--out", clob, "--base", tiny_ce_dir, "--epochs", "1",
                      "--no-progress")
    assert res.exit_code == 2, out
    assert "--out" in out and "cross-encoder" in out
    assert json.loads((clob / "config.json").read_text()) == {"mine": 1}


# ---------------------------------------------------------------- case 4: fit into a folder that cannot be written


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: read-only mode bits do not stop it")
def test_fit_into_an_unwritable_folder_is_named(tmp_path, train_beir):
    imm = tmp_path / "imm"
    imm.mkdir()
    imm.chmod(0o555)
    try:
        res, out = invoke("fit", "--data", train_beir, "--out", imm / "fit", "--no-progress")
    finally:
        imm.chmod(0o755)
    assert res.exit_code == 2 and "cannot create files in" in out and "Traceback" not in out, out


def test_fit_into_a_read_only_filesystem_is_named(tmp_path, train_beir, monkeypatch):
    """Root ignores mode bits: the probe behind --out's check is what fails on a read-only mount. Here the probe is
    made to fail as a read-only mount fails it (EROFS at mkstemp), to see the message reach the user."""
    import tempfile

    real = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == tmp_path:
            raise OSError(30, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    res, out = invoke("fit", "--data", train_beir, "--out", tmp_path / "fit", "--no-progress")
    assert res.exit_code == 2 and "cannot create files in" in out and "--out" in out, out
    assert not (tmp_path / "fit").exists()


# ---------------------------------------------------------------- cases 5, 7: numbers of the wrong type or not finite


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_fit_epochs_not_finite_is_refused_before_any_work(tmp_path, train_beir, value):
    res, out = invoke("fit", "--data", train_beir, "--out", tmp_path / "f", "--epochs", value, "--no-progress")
    assert res.exit_code == 2 and out.startswith("error: --epochs"), out
    assert not (tmp_path / "f" / "recipe.json").exists()


@pytest.mark.parametrize("kwargs, needle", [
    ({"epochs": "3"}, "epochs="), ({"epochs": float("inf")}, "epochs="), ({"lr": "fast"}, "lr="),
    ({"batch_size": 2.5}, "batch_size="), ({"rank_to": float("nan")}, "rank_to="), ({"margins": (0.1, "x")}, "margins="),
    ({"seed": -1}, "seed="), ({"dev_fraction": float("nan")}, "dev_fraction=")])
def test_python_fit_names_the_parameter(tmp_path, train_beir, kwargs, needle):
    with pytest.raises(TwoTowerError, match=f"^{needle}"):
        tt.fit(train_beir, tmp_path / "f", show_progress=False, **kwargs)
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("kwargs, needle", [
    ({"lr": "fast"}, "lr="), ({"epochs": "3"}, "epochs="), ({"batch_size": 2.5}, "batch_size="),
    ({"warmup": float("nan")}, "warmup="), ({"temperature": float("inf")}, "temperature="),
    ({"steps": 1e30}, "steps="), ({"hard_negatives": "1"}, "hard_negatives=")])
def test_stage_config_names_the_field(kwargs, needle):
    with pytest.raises(TwoTowerError, match=f"stage 'finetune': {needle}"):
        tt.StageConfig(**kwargs).validate()


def test_toml_numbers_not_finite_or_huge_are_named(tmp_path):
    for line, needle in (("lr = inf", "lr = inf: a finite number"), ("epochs = nan", "epochs = nan"),
                         ("steps = 99999999999999", "steps = 99999999999999: a whole number"),
                         ("batch_size = 1e400", "batch_size")):
        path = tmp_path / "stages.toml"
        path.write_text(f'out = "run"\n[[stage]]\ndata = "d"\n{line}\n')
        with pytest.raises(TwoTowerError, match=f"^{path}: stage 1: .*{needle}"):
            tt.TrainConfig.from_toml(path).validate()


def test_train_config_numbers(tmp_path):
    for kwargs, needle in (({"dim": 0}, "dim="), ({"dim": 2.5}, "dim="), ({"seed": float("nan")}, "seed="),
                           ({"checkpoint_every": float("inf")}, "checkpoint_every="),
                           ({"attention_dropout": float("nan")}, "attention_dropout="),
                           ({"multivector": 0}, "multivector="), ({"matryoshka": [8, "x"]}, "matryoshka=")):
        with pytest.raises(TwoTowerError, match=f"^{needle}"):
            tt.TrainConfig(out=str(tmp_path / "r"), **kwargs).validate()


def test_reranker_config_numbers():
    for kwargs, needle in (({"lr": float("nan")}, "lr="), ({"epochs": 0}, "epochs="), ({"epochs": 1.5}, "epochs="),
                           ({"negatives": "3"}, "negatives="), ({"max_length": 10**12}, "max_length=")):
        with pytest.raises(TwoTowerError, match=f"^{needle}"):
            tt.RerankerTrainConfig(**kwargs)


# ---------------------------------------------------------------- case 12 (part): pretrain --chunk-tokens 2


def test_short_chunks_take_a_matching_min_tokens():
    assert tt.ViewConfig(chunk_tokens=2).min_tokens == 2
    assert tt.ViewConfig(chunk_tokens=300).min_tokens == 10
    tt.ViewConfig(chunk_tokens=2).validate()
    with pytest.raises(TwoTowerError, match="min_tokens=5.*at most 4"):
        tt.ViewConfig(chunk_tokens=4, min_tokens=5).validate()
    with pytest.raises(TwoTowerError, match="delete=nan"):
        tt.ViewConfig(delete=math.nan).validate()


# ---------------------------------------------------------------- case 5 and kinds: score_run, metric names, runs


def test_score_run_with_a_float_grade_names_the_judgement():
    with pytest.raises(TwoTowerError, match=r"qrels\['q1'\]\['d1'\] = 1.5: a relevance grade is a whole number"):
        tt.score_run({"q1": {"d1": 1.0}}, {"q1": {"d1": 1.5}})
    with pytest.raises(TwoTowerError, match=r"run\['q1'\]\['d1'\] = nan"):
        tt.score_run({"q1": {"d1": float("nan")}}, {"q1": {"d1": 1}})
    with pytest.raises(TwoTowerError, match=r"query id 1 is a int"):
        tt.score_run({1: {"d1": 1.0}}, {"q1": {"d1": 1}})
    with pytest.raises(TwoTowerError, match=r"qrels: a dict"):
        tt.score_run({"q1": {"d1": 1.0}}, [("q1", "d1", 1)])
    import numpy as np

    # numpy numbers are numbers: by hand, d1 relevant at rank 2 of 2 gives P@1 0 and MRR@10 0.5
    got = tt.score_run({"q1": {"d0": np.float32(2.0), "d1": np.float64(1.0)}}, {"q1": {"d1": np.int64(1)}},
                       ["p@1", "mrr@10"])
    assert got == {"p@1": 0.0, "mrr@10": 0.5}


@pytest.mark.parametrize("name", ["NDCG@10", "ndcg_cut_10", "ndcg_cut.10", "ndcg@010", " ndcg@10 ", "nDCG@10"])
def test_metric_spellings_of_ndcg_at_10_score_the_same(name):
    run, qrels = {"q1": {"d0": 3.0, "d1": 2.0, "d2": 1.0}}, {"q1": {"d1": 1, "d2": 2}}
    # by hand (trec_eval's gain is the grade): gains 0, 1, 2 at ranks 1-3: DCG = 1/log2(3) + 2/log2(4);
    # the ideal order 2, 1: 2/log2(2) + 1/log2(3)
    expected = (1 / math.log2(3) + 2 / 2) / (2 + 1 / math.log2(3))
    # one key whatever the spelling (issue #55): the canonical ndcg@10
    assert tt.score_run(run, qrels, [name]) == {"ndcg@10": pytest.approx(expected)}


@pytest.mark.parametrize("metrics, needle", [
    (["ndcg@10", "NDCG@10"], "same metric"), (["ndcg@0"], "at least 1"), (["ndcg@99999999999"], "at most"),
    (["ndcg@1.5"], "name@k"), (["ndcg"], "name@k"), (["bleu@10"], "unknown metric"), ([], "no metric"),
    ([10], "not int")])
def test_metric_names_refused_with_a_reason(metrics, needle):
    with pytest.raises(TwoTowerError, match=needle):
        tt.score_run({"q1": {"d1": 1.0}}, {"q1": {"d1": 1}}, metrics)


def test_a_run_file_listing_a_document_twice_is_named(tmp_path):
    from twotower.errors import DataError

    path = tmp_path / "run.trec"
    path.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 d1 3 0.5 t\n")
    with pytest.raises(DataError, match=r"line 3, field 'docid': document 'd1' is listed twice for query 'q1' "
                                        r"\(first on line 1\)"):
        tt.read_run(path)
    path.write_text("q1 Q0 d1 1 nan t\n")
    with pytest.raises(DataError, match="line 1.*finite"):
        tt.read_run(path)
    path.write_text("q1 Q0 d1 1 2.0 t\nq2 Q0 d1 1 2.0 t\n")  # one document for two queries is fine
    assert tt.read_run(path) == {"q1": {"d1": 2.0}, "q2": {"d1": 2.0}}


def test_write_run_refuses_scores_that_no_reader_takes(tmp_path):
    with pytest.raises(TwoTowerError, match="nan"):
        tt.write_run({"q1": {"d1": float("nan")}}, tmp_path / "r.trec")
    assert not (tmp_path / "r.trec").exists()


# ---------------------------------------------------------------- kind: documents with no usable term in BM25


@pytest.mark.parametrize("ngram", [1, 2])
def test_bm25_documents_without_terms_match_nothing(ngram):
    from twotower.retrieval.bm25 import BM25, BM25Params

    docs = ["the and of", "!!! ...", "cats eat fish", "dogs eat bones"]
    bm = BM25(BM25Params(ngram=ngram)).index(["d0", "d1", "d2", "d3"], docs, show_progress=False)
    run = bm.search_run(["stop", "cats", "none"], ["the of", "cats", "zebra"], 10, show_progress=False)
    assert run["stop"] == {} and run["none"] == {}  # no usable term: no hits, not the term-less documents
    assert set(run["cats"]) == {"d2"} and run["cats"]["d2"] > 0
    empty = BM25(BM25Params(ngram=ngram)).index(["a", "b"], ["the of", "..."], show_progress=False)
    assert empty.search_run(["q"], ["cats the"], 5, show_progress=False) == {"q": {}}


# ---------------------------------------------------------------- the Python API: numbers, texts, raw exceptions


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory, tiny_bert_dir):
    from conftest import flat_index

    root = tmp_path_factory.mktemp("r4")
    data = write_beir(root / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    return flat_index(data, tiny_bert_dir, root / "idx"), data


@pytest.mark.parametrize("call, needle", [
    (lambda ix, enc: enc.encode_queries(["tea \ud800"]), r"queries\[0\] holds a lone surrogate"),
    (lambda ix, enc: enc.encode_documents([{"title": "\udc00", "text": "x"}]), r"documents\[0\] holds a lone surr"),
    (lambda ix, enc: enc.encode_multivector(["\ud800"], m=2), r"documents\[0\] holds a lone surrogate"),
    (lambda ix, enc: ix.search("tea \ud800"), r"query\[0\] holds a lone surrogate"),
    (lambda ix, enc: ix.search("tea \ud800", mode="bm25"), r"query\[0\] holds a lone surrogate"),
    (lambda ix, enc: ix.run({"q": "tea \ud800"}), r"queries\[0\] holds a lone surrogate"),
    (lambda ix, enc: enc.encode_queries(["x"], batch_size=0), r"^batch_size=0"),
    (lambda ix, enc: enc.encode_multivector(["x"], m=0), r"^m=0"),
    (lambda ix, enc: ix.search("tea", k=10**20), r"^k=100000000000000000000"),
    (lambda ix, enc: ix.search("tea", k=5, ef_search=float("nan")), r"^ef_search=nan"),
    (lambda ix, enc: ix.search("tea", k=5, lam=2.0, mode="hybrid"), r"^lam=2"),
    (lambda ix, enc: ix.run({"q": "tea"}, k=0), r"^k=0"),
    (lambda ix, enc: ix.add([{"_id": "d9", "text": "x"}], batch_size=0), r"^batch_size=0"),
    (lambda ix, enc: ix.remove([1]), r"^ids: .*1 is a int"),
])
def test_api_calls_name_the_parameter(tiny_index, tiny_bert_dir, call, needle):
    index = tt.Index.open(tiny_index[0], precision="fp32")
    enc = tt.Encoder.load(tiny_bert_dir, device="cpu", precision="fp32")
    with pytest.raises(TwoTowerError, match=needle):
        call(index, enc)


@pytest.mark.parametrize("kwargs, needle", [
    ({"multivector": 0}, r"^multivector=0"), ({"batch_size": 0}, r"^batch_size=0"),
    ({"vectors": "binary", "rescore_factor": float("nan")}, r"^rescore_factor=nan"),
    ({"rescore_factor": 8}, r"^rescore_factor applies to binary vectors"),
    ({"kind": "flat", "hnsw_m": 16}, r"^hnsw_m applies to kind hnsw"),
    ({"workers": 2}, r"^workers set how Ray encodes"),
    ({"gpus_per_worker": float("inf")}, r"^gpus_per_worker=inf"),
    ({"gpus_per_worker": 1.0}, r"^gpus_per_worker set how Ray encodes"),
])
def test_index_build_options_checked_before_encoding(tmp_path, tiny_bert_dir, kwargs, needle):
    with pytest.raises(TwoTowerError, match=needle):
        tt.Index.build(tmp_path / "ix", {"d1": "green tea", "d2": "coffee"}, encoder=str(tiny_bert_dir),
                       show_progress=False, **kwargs)
    assert not (tmp_path / "ix").exists()


def test_cli_workers_without_ray_is_refused(tmp_path, tiny_bert_dir, tiny_beir):
    for extra, needle in ((["--workers", "2"], "--workers set how Ray encodes"),
                          (["--gpus-per-worker", "inf"], "--gpus-per-worker inf")):
        res, out = invoke("index", "build", "--data", tiny_beir, "--out", tmp_path / "ix", "--model", tiny_bert_dir,
                          "--no-progress", *extra)
        assert res.exit_code == 2 and needle in out, out
    assert not (tmp_path / "ix").exists()


@pytest.mark.parametrize("kwargs, needle", [
    ({"k": 0}, r"^k=0"), ({"k": float("inf")}, r"^k=inf"), ({"multivector": 0, "mode": "multivector"}, "multivector=0"),
    ({"lam": float("nan"), "mode": "hybrid"}, r"^lam=nan"), ({"k1": float("nan")}, r"^k1=nan"),
    ({"batch_size": 0}, r"^batch_size=0"), ({"metrics": ["NDCG@10", "ndcg_cut_10"]}, "same metric")])
def test_evaluate_numbers_named(tiny_beir, kwargs, needle):
    with pytest.raises(TwoTowerError, match=needle):
        tt.evaluate("bm25" if "mode" not in kwargs else None, tiny_beir, **kwargs)


def test_create_app_limits_checked():
    for kwargs, needle in (({"max_k": 0}, r"^max_k=0"), ({"max_body_bytes": 10}, r"^max_body_bytes=10"),
                           ({"max_batch": float("nan")}, r"^max_batch=nan")):
        with pytest.raises(TwoTowerError, match=needle):
            tt.create_app("no-such-index", **kwargs)


def test_models_fetch_of_a_bundled_model_refuses_dest(tmp_path):
    res, out = invoke("models", "fetch", "minilm-l6", "--dest", tmp_path / "x")
    assert res.exit_code == 2 and "--dest" in out and "bundled" in out, out
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- case 8: one id rule, the service included


def test_a_long_id_added_to_an_index_is_read_and_removed_over_http(tiny_index, tmp_path):
    import shutil

    from fastapi.testclient import TestClient

    path = tmp_path / "idx"
    shutil.copytree(tiny_index[0], path)
    long_id = "x" * 300
    tt.Index.open(path, precision="fp32").add([{"_id": long_id, "title": "", "text": "green tea leaves"}])
    client = TestClient(tt.create_app(path, api_key="k" * 32, precision="fp32"))
    got = client.get(f"/documents/{long_id}")
    assert got.status_code == 200 and got.json()["id"] == long_id, got.text
    gone = client.delete(f"/documents/{long_id}", headers={"X-API-Key": "k" * 32})
    assert gone.status_code == 200, gone.text
    too_long = "y" * 1025
    with pytest.raises(TwoTowerError, match="1025 bytes long"):
        tt.Index.open(path, precision="fp32").add([{"_id": too_long, "text": "x"}])
    assert client.get(f"/documents/{too_long}").status_code == 422


def test_a_huge_number_in_a_request_body_is_named(tiny_index):
    from fastapi.testclient import TestClient

    client = TestClient(tt.create_app(tiny_index[0], precision="fp32"))
    got = client.post("/search", content=b'{"query": "tea", "k": ' + b"9" * 5000 + b"}",
                      headers={"Content-Type": "application/json"})
    assert got.status_code == 400 and "4,300 digits" in got.json()["detail"], got.text


# ---------------------------------------------------------------- case 11: the framework retrievers


def test_framework_retrievers_check_search_breadth_at_construction(tiny_index):
    from twotower.integrations.langchain import TwoTowerRetriever as LangChainRetriever
    from twotower.integrations.llama_index import TwoTowerRetriever as LlamaRetriever

    index = tt.Index.open(tiny_index[0], precision="fp32")
    for make in (LangChainRetriever, LlamaRetriever):
        with pytest.raises(TwoTowerError, match="efSearch applies to HNSW"):
            make(index, k=3, ef_search=5)
        with pytest.raises(TwoTowerError, match="nprobe applies to IVF"):
            make(index, k=3, nprobe=5)
    with pytest.raises(TwoTowerError, match="unknown option.*ef_serach"):
        LlamaRetriever(index, k=3, ef_serach=5)


# ---------------------------------------------------------------- case 3: a full disk (a real, small file system)


@pytest.fixture()
def small_fs(tmp_path):
    """A 2 MiB tmpfs at ``tmp_path/fs`` (root only; skipped where mounting is not permitted)."""
    import subprocess

    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(fs: Path, leave_kib: int) -> None:
    (fs / "filler").unlink(missing_ok=True)
    free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize // 1024
    with (fs / "filler").open("wb") as handle:
        handle.write(b"\0" * max(0, free - leave_kib) * 1024)


def _cli(*argv):
    import subprocess
    import sys

    from conftest import subprocess_env

    done = subprocess.run([sys.executable, "-m", "twotower.cli", *map(str, argv)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=600)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _docs(path: Path, start: int, n: int) -> Path:
    import random

    rng = random.Random(start)
    words = "cat dog tea rust python cell sun moon river stone tree bird fish apple music train leaf".split()
    path.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(words, k=30))}) + "\n"
                            for i in range(start, start + n)))
    return path


def test_index_writes_on_a_full_disk_say_so_and_keep_the_index(small_fs, tmp_path, tiny_bert_dir):
    """Before: ``index add`` / ``index remove`` died by SIGBUS (exit 135, a .tmp-* folder left), since the vectors
    were written through a memory map of a sparse file; ``index build`` printed FAISS's errno 28 traceback."""
    data = tmp_path / "data"
    data.mkdir()
    _docs(data / "corpus.jsonl", 0, 200)
    (data / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "tea"}) + "\n")
    (data / "qrels").mkdir()
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    idx = small_fs / "idx"
    rc, out = _cli("index", "build", "--data", data, "--out", idx, "--model", tiny_bert_dir, "--bm25", "--no-progress")
    assert rc == 0, out
    before = {p.relative_to(idx): p.read_bytes() for p in idx.rglob("*") if p.is_file() and p.name != ".lock"}
    more = _docs(tmp_path / "more.jsonl", 200, 2000)
    for leave, argv in ((150, ("index", "add", "--index", idx, "--docs", more, "--no-progress")),
                        (900, ("index", "add", "--index", idx, "--docs", more, "--no-progress")),
                        (100, ("index", "remove", "--index", idx, "d3"))):
        _fill(small_fs, leave)
        rc, out = _cli(*argv)
        assert rc == 2, (leave, argv[1], rc, out)
        assert f"no space left on {idx}" in out and "Traceback" not in out, out
        after = {p.relative_to(idx): p.read_bytes() for p in idx.rglob("*") if p.is_file() and p.name != ".lock"}
        assert after == before  # no .tmp-* folder, no new version, CURRENT as it was
    _fill(small_fs, 20)
    rc, out = _cli("index", "build", "--data", data, "--out", small_fs / "idx2", "--model", tiny_bert_dir,
                   "--no-progress")
    assert rc == 2 and f"no space left on {small_fs / 'idx2'}" in out and "Traceback" not in out, out
    assert not (small_fs / "idx2").exists()
    _fill(small_fs, 0)
    rc, out = _cli("eval", "--data", data, "--run", small_fs / "run.trec", "--no-progress")
    assert rc == 2 and f"no space left on {small_fs / 'run.trec'}" in out and "Traceback" not in out, out
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler", "idx"]


def test_library_errors_that_mean_a_full_disk():
    from twotower.io import is_disk_full

    assert is_disk_full(OSError(28, "No space left on device"))
    assert is_disk_full(OSError("34536 requested and 21472 written"))  # numpy's tofile
    assert is_disk_full(RuntimeError("Error in faiss::FileIOWriter ... write error ... (errno 28)".replace(
        "(errno 28)", "errno 28")))
    assert not is_disk_full(OSError(13, "Permission denied"))
    assert not is_disk_full(RuntimeError("something else"))


# ---------------------------------------------------------------- case 6: a writer holding the index lock


def test_index_remove_gives_up_on_a_held_lock(tiny_index, tmp_path):
    import fcntl
    import shutil
    import time

    path = tmp_path / "idx"
    shutil.copytree(tiny_index[0], path)
    with (path / ".lock").open("a") as handle:  # another writer, as writer_lock holds it
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        handle.write(json.dumps({"pid": 4242, "command": "twotower index add"}) + "\n")
        handle.flush()
        t0 = time.monotonic()
        res, out = invoke("index", "remove", "--index", path, "d1", "--lock-timeout", "0.5")
        assert res.exit_code == 2 and "locked by another writer" in out and "pid 4242" in out, out
        assert "--lock-timeout" in out and time.monotonic() - t0 < 30
        with pytest.raises(TwoTowerError, match="lock_timeout="):
            tt.Index.open(path, precision="fp32").remove(["d1"], lock_timeout=0)
        with pytest.raises(TwoTowerError, match="^lock_timeout=-1"):
            tt.Index.open(path, precision="fp32").remove(["d1"], lock_timeout=-1)
    assert "d1" in {h.id for h in tt.Index.open(path, precision="fp32").search("cats", k=5, mode="bm25")}
    tt.Index.open(path, precision="fp32").remove(["d1"], lock_timeout=0)  # free again: removed
    assert len(tt.Index.open(path)) == len(TINY_CORPUS) - 1


# ---------------------------------------------------------------- case 12: data paths a user cannot act on


def test_gzip_is_named_not_read(tmp_path, tiny_beir):
    import gzip
    import shutil

    from twotower.errors import DataError

    folder = tmp_path / "gz"
    shutil.copytree(tiny_beir, folder)
    corpus = (folder / "corpus.jsonl").read_bytes()
    (folder / "corpus.jsonl").unlink()
    (folder / "corpus.jsonl.gz").write_bytes(gzip.compress(corpus))
    with pytest.raises(DataError, match=r"corpus.jsonl: file not found; corpus.jsonl.gz is there, but twotower "
                                        r"reads uncompressed UTF-8 files only.*gunzip -k"):
        tt.load_beir(folder)
    (folder / "corpus.jsonl").write_bytes(gzip.compress(corpus))  # gzip bytes under the plain name
    with pytest.raises(DataError, match=r"corpus.jsonl: is gzip-compressed"):
        tt.load_beir(folder)


def test_data_locate_of_a_file_path_says_what_to_give(tiny_beir, tmp_path):
    res, out = invoke("data", "locate", tiny_beir / "corpus.jsonl", "--cache", tmp_path / "cache")
    assert res.exit_code == 2 and "is a file, not a data directory" in out and "checksum" not in out, out
    res, out = invoke("data", "locate", tmp_path / "dv" / "ok" / "corpus.jsonl", "--cache", tmp_path / "cache")
    assert res.exit_code == 2 and "names a file, not a BEIR data set" in out and "checksum" not in out, out
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------- options a mode silently ignores


@pytest.mark.parametrize("kwargs, needle", [
    ({"mine": False, "mined_epochs": 3.0}, "mined_epochs"), ({"mine": False, "margins": (0.1,)}, "margins"),
    ({"mine": False, "rank_to": 30}, "rank_to"), ({"reranker": False, "rerank_depth": 50}, "rerank_depth"),
    ({"reranker": False, "reranker_epochs": 2}, "reranker_epochs")])
def test_fit_refuses_settings_its_mode_ignores(tmp_path, train_beir, kwargs, needle):
    with pytest.raises(TwoTowerError, match=f"^{needle}"):
        tt.fit(train_beir, tmp_path / "f", show_progress=False, **kwargs)
    res, out = invoke("fit", "--data", train_beir, "--out", tmp_path / "g", "--no-mine", "--mined-epochs", "3")
    assert res.exit_code == 2 and out.startswith("error: --mined-epochs"), out


def test_train_refuses_num_negatives_without_hard_negatives(tmp_path, train_beir):
    cfg = tt.TrainConfig(out=str(tmp_path / "r"), stages=[tt.StageConfig(data=str(train_beir))])
    with pytest.raises(TwoTowerError, match="^num_negatives=3"):
        tt.train(cfg, num_negatives=3)
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- case 9: eval with a re-ranker reports the pipeline


def test_eval_with_rerank_reports_the_whole_pipeline(tiny_beir, tiny_ce_dir, tmp_path):
    res = tt.evaluate("bm25", tiny_beir, rerank=str(tiny_ce_dir), precision="fp32", device="cpu")
    t, n = res.timings, res.num_queries
    assert t["rerank_s"] > 0 and t["first_stage_queries_per_s"] > t["queries_per_s"]
    # the rate is the queries over the first stage's time plus the re-ranking's (timings are rounded to 4 places)
    assert t["queries_per_s"] == pytest.approx(n / (n / t["first_stage_queries_per_s"] + t["rerank_s"]), rel=1e-2)
    res_cli, out = invoke("eval", "--data", tiny_beir, "--retriever", "bm25", "--rerank", tiny_ce_dir, "--precision",
                          "fp32", "--device", "cpu", "--no-progress", "--out", tmp_path / "r.json")
    assert res_cli.exit_code == 0, out
    assert "bm25 + rerank" in out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["retriever"] == "bm25" and saved["rerank"] and "first_stage_queries_per_s" in saved["timings"]
