"""A second round of bad input (issue #24): each case must stop with exit code 2 and a one-line message naming
the option, file or field, with no traceback, and must leave the files it was given as they were."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from twotower.cli import app

runner = CliRunner()


def _cli(*argv):
    return runner.invoke(app, [str(a) for a in argv])


def _refused(res, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    text = " ".join(res.output.split())
    for fragment in fragments:
        assert fragment in text, res.output


# ---- eval: numbers out of range, options the retriever would ignore --------------------------------------

EVAL_CASES = [
    (["--metrics", "ndcg@0"], "the cutoff k must be at least 1"),  # pytrec_eval aborted the process (exit 134)
    (["--metrics", "recall@-3"], "the cutoff k must be at least 1"),
    (["--metrics", ",,"], "--metrics names no metric"),
    (["--metrics", ""], "--metrics names no metric"),
    (["--k1", "-1"], "--k1"),
    (["--k1", "nan"], "--k1"),
    (["--k1", "inf"], "--k1"),
    (["--b", "2"], "--b"),
    (["--b", "-0.1"], "--b"),
    (["--b", "nan"], "--b"),
    (["--retriever", "dense", "--lambda", "0.5"], "--lambda"),
    (["--retriever", "bm25", "--lambda", "0.5"], "--lambda"),
    (["--retriever", "dense", "--k1", "1.2"], "--k1 set BM25"),
    (["--retriever", "bm25", "--multivector", "4"], "--multivector"),
]


@pytest.mark.parametrize("extra,message", EVAL_CASES, ids=[" ".join(c[0]) or "empty" for c in EVAL_CASES])
def test_eval_refuses_bad_numbers_and_ignored_options(tiny_beir, monkeypatch, extra, message):
    import twotower.data.beir as beir

    def no_loading(*a, **k):
        raise AssertionError("the data set was loaded before the options were checked")

    monkeypatch.setattr(beir.BeirDataset, "load", no_loading)
    _refused(_cli("eval", "--data", tiny_beir, "--no-progress", "--device", "cpu", *extra), message)


def test_bm25_params_reject_out_of_range_values():
    from twotower.retrieval.bm25 import BM25Params

    for bad in ({"k1": -0.5}, {"k1": float("nan")}, {"b": 1.5}, {"b": float("inf")}):
        with pytest.raises(ValueError):
            BM25Params(**bad)
    BM25Params(k1=0.0, b=0.0)
    BM25Params(k1=3.0, b=1.0)


# ---- outputs naming an input file: the input was overwritten with results ---------------------------------

@pytest.mark.parametrize("argv", [
    ["eval", "--data", "{d}", "--out", "{d}/corpus.jsonl", "--no-progress"],
    ["eval", "--data", "{d}", "--run", "{d}/queries.jsonl", "--no-progress"],
    ["eval", "--data", "{d}", "--out", "{d}/qrels/test.tsv", "--no-progress"],
    ["mine", "--data", "{d}", "--split", "test", "--out", "{d}/qrels/test.tsv", "--no-progress"],
])
def test_an_output_never_overwrites_an_input(tiny_beir, argv):
    before = {p: p.read_bytes() for p in tiny_beir.rglob("*") if p.is_file()}
    res = _cli(*[a.format(d=tiny_beir) for a in argv])
    _refused(res, "is an input of this command", "give another file")
    assert {p: p.read_bytes() for p in tiny_beir.rglob("*") if p.is_file()} == before


def test_report_page_never_overwrites_an_analysis(tmp_path):
    folder = tmp_path / "analysis"
    folder.mkdir()
    fidelity = folder / "latency.json"
    fidelity.write_text(json.dumps({"rows": []}))
    res = _cli("analyze", "report", "--out", folder, "--page", fidelity)
    _refused(res, "--page", "is an input of this command")
    assert json.loads(fidelity.read_text()) == {"rows": []}


# ---- training settings: infinities, stage tables, stage names, --config paths -----------------------------

@pytest.mark.parametrize("field,value", [("epochs", float("inf")), ("temperature", float("inf")),
                                         ("lr", float("inf")), ("weight_decay", float("inf"))])
def test_stage_refuses_infinite_numbers(field, value):
    from twotower.errors import TwoTowerError
    from twotower.training.config import StageConfig

    with pytest.raises(TwoTowerError, match=f"{field}=inf"):
        StageConfig(data="x", **{field: value}).validate()


@pytest.mark.parametrize("name", ["../../victim", "a/b", "", ".", ".hidden", "/abs"])
def test_stage_name_cannot_leave_the_run_folder(name):
    from twotower.errors import TwoTowerError
    from twotower.training.config import StageConfig

    with pytest.raises(TwoTowerError, match="names the folder"):
        StageConfig(name=name, data="x").validate()
    StageConfig(name="stage-2.b_c", data="x").validate()


@pytest.mark.parametrize("toml", ["stage = 5\n", 'stage = ["x"]\n', '[stage]\ndata = "d"\n'])
def test_stage_must_be_an_array_of_tables(tmp_path, toml):
    path = tmp_path / "s.toml"
    path.write_text(toml)
    _refused(_cli("train", "--config", path, "--out", tmp_path / "run"), "'stage' must be an array of tables")


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_config_that_is_no_file(tmp_path, kind):
    path = tmp_path / "s.toml"
    if kind == "directory":
        path.mkdir()
    _refused(_cli("train", "--config", path, "--out", tmp_path / "run"), f"--config {path}")


def test_epochs_inf_on_the_cli(tiny_beir, tmp_path):
    _refused(_cli("train", "--data", tiny_beir, "--split", "test", "--out", tmp_path / "r", "--epochs", "inf"),
             "epochs inf")


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_resume_without_checkpoint_keeps_a_finished_model(tiny_beir, tmp_path, tiny_bert_dir, command):
    """--resume on a folder with a finished model and no checkpoint started from scratch and replaced it."""
    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)
    (out / "model" / "weights").write_text("trained")
    data = ["--data", tiny_beir, "--split", "test"] if command == "train" else ["--corpus", tiny_beir]
    res = _cli(command, *data, "--out", out, "--resume", "--model", tiny_bert_dir, "--steps", "1",
               "--batch-size", "2", "--device", "cpu", "--no-progress")
    _refused(res, "nothing to continue", "choose another --out")
    assert (out / "model" / "weights").read_text() == "trained"


def test_error_text_in_brackets_is_printed(tmp_path):
    """rich read '[nan, 0.5]' in an error as markup and printed nothing of it."""
    res = _cli("pretrain", "--corpus", tmp_path, "--out", tmp_path / "r", "--crop-min", "nan")
    _refused(res, "got [nan, 0.5]")


# ---- re-rankers: a plain encoder is no cross-encoder; train-reranker's numbers, split and --out -----------

def test_a_plain_encoder_is_refused_as_reranker(tiny_bert_dir):
    """Loaded as a cross-encoder, a BertModel gets a random scoring head: every score ~0.5, a silent shuffle."""
    from twotower.errors import ModelError
    from twotower.retrieval.rerank import Reranker

    with pytest.raises(ModelError, match="not a cross-encoder: its config.json names BertModel"):
        Reranker(tiny_bert_dir, device="cpu")


@pytest.mark.parametrize("extra,message", [
    (["--lr", "0"], "--lr 0.0"), (["--lr", "nan"], "--lr nan"), (["--lr", "inf"], "--lr inf"),
    (["--split", "test"], "--split test"),
])
def test_train_reranker_refuses(tiny_beir, tmp_path, tiny_bert_dir, extra, message):
    res = _cli("train-reranker", "--data", tiny_beir, "--out", tmp_path / "ce", "--base", tiny_bert_dir,
               "--device", "cpu", "--no-progress", *extra)
    _refused(res, message)
    assert not (tmp_path / "ce").exists()


def test_train_reranker_never_replaces_another_folder(tiny_beir, tmp_path, tiny_bert_dir):
    """--out naming a training run's folder replaced the whole folder (model, logs) with the cross-encoder."""
    import shutil

    shutil.copy(tiny_beir / "qrels" / "test.tsv", tiny_beir / "qrels" / "train.tsv")
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "train_log.json").write_text("[]")
    res = _cli("train-reranker", "--data", tiny_beir, "--out", run, "--base", tiny_bert_dir, "--device", "cpu",
               "--no-progress")
    _refused(res, f"--out {run} is a folder holding other files, not a cross-encoder")
    assert sorted(p.name for p in run.iterdir()) == ["model", "train_log.json"]


# ---- table and serve --------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ['{"nope": 1}', "[1, 2]", '{"retriever": "bm25", "metrics": "x"}',
                                     '{"retriever": "bm25", "metrics": {"ndcg@10": "high"}}', '"text"'])
def test_table_of_a_json_that_is_no_result(tmp_path, content):
    path = tmp_path / "r.json"
    path.write_text(content)
    _refused(_cli("table", path), f"{path}: not a result of 'twotower eval --out'")


def test_table_of_a_real_result(tiny_beir, tmp_path):
    out = tmp_path / "r.json"
    assert _cli("eval", "--data", tiny_beir, "--out", out, "--no-progress").exit_code == 0
    res = _cli("table", out, out)
    rows = [line for line in res.output.splitlines() if line.startswith("│")]  # the table's rows, not its notes
    assert res.exit_code == 0 and [r.split("│")[1].strip() for r in rows] == ["bm25", "bm25"], res.output


def test_serve_unknown_log_level(tmp_path):
    _refused(_cli("serve", "--index", tmp_path, "--log-level", "loud"), "--log-level loud: choose one of")


# ---- search, fidelity, index build, pretrain, mine: options that would be ignored or make no sense --------

@pytest.mark.parametrize("argv,message", [
    (["search", "--index", "{t}", ""], "QUERY is empty"),
    (["search", "--index", "{t}", "   "], "QUERY is empty"),
    (["search", "--index", "{t}", "cats", "--mode", "dense", "--lambda", "0.3"], "--mode dense does not use it"),
    (["search", "--index", "{t}", "cats", "--mode", "rrf", "--lambda", "0.3"], "--mode rrf does not use it"),
    (["analyze", "fidelity", "--data", "{t}", "--out", "{t}/a", "--doc-lengths", "16,0"], "--doc-lengths: 0 is not a length"),
    (["analyze", "fidelity", "--data", "{t}", "--out", "{t}/a", "--doc-lengths", "-5"], "--doc-lengths: -5 is not a length"),
    (["pretrain", "--corpus", "{t}", "--out", "{t}/r", "--delete", "1.0"], "must add up to less than 1"),
    (["pretrain", "--corpus", "{t}", "--out", "{t}/r", "--delete", "0.5", "--replace", "0.5"], "must add up to less than 1"),
])
def test_refused_before_any_work(tmp_path, argv, message):
    """Each is refused before an index, model or corpus is read (the folder given holds nothing)."""
    _refused(_cli(*[a.format(t=tmp_path) for a in argv]), message)


def test_serve_refuses_a_blank_query(tiny_beir, tiny_bert_dir, tmp_path):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    index = tmp_path / "idx"
    assert _cli("index", "build", "--data", tiny_beir, "--out", index, "--model", tiny_bert_dir, "--device", "cpu",
                "--no-progress").exit_code == 0
    client = TestClient(create_app(index, device="cpu", query_runtime="torch"))
    assert client.post("/search", json={"query": " \n ", "k": 3}).status_code == 422
    assert client.post("/search/batch", json={"queries": ["cats", "  "], "k": 3}).status_code == 422
    assert client.post("/search", json={"query": " cats ", "k": 3}).status_code == 200


@pytest.mark.parametrize("extra,message", [
    (["--kind", "flat", "--nlist", "2"], "--nlist applies to --kind ivf | ivfpq, not 'flat'"),
    (["--kind", "hnsw", "--nlist", "2"], "--nlist applies to --kind ivf | ivfpq, not 'hnsw'"),
    (["--kind", "ivf", "--nlist", "2", "--pq-m", "4"], "--pq-m applies to --kind ivfpq, not 'ivf'"),
])
def test_index_build_refuses_options_its_kind_ignores(tiny_beir, tiny_bert_dir, tmp_path, extra, message):
    res = _cli("index", "build", "--data", tiny_beir, "--out", tmp_path / "idx", "--model", tiny_bert_dir,
               "--device", "cpu", "--no-progress", *extra)
    _refused(res, message)
    assert not (tmp_path / "idx" / "CURRENT").exists()


def test_mine_refuses_a_model_bm25_would_ignore(tiny_beir, tiny_bert_dir, tmp_path):
    res = _cli("mine", "--data", tiny_beir, "--split", "test", "--out", tmp_path / "m.jsonl", "--model", tiny_bert_dir)
    _refused(res, "is not used by --retriever bm25")
    assert not (tmp_path / "m.jsonl").exists()


# ---- data files: a directory or device in place of a file, conflicting qrels rows --------------------------

@pytest.mark.parametrize("name", ["corpus.jsonl", "queries.jsonl"])
def test_a_directory_in_place_of_a_data_file(tiny_beir, name):
    (tiny_beir / name).unlink()
    (tiny_beir / name).mkdir()
    _refused(_cli("eval", "--data", tiny_beir, "--no-progress"), f"{name}: is a directory, not a file")


def test_a_device_in_place_of_a_corpus(tmp_path):
    from twotower.data.beir import load_corpus
    from twotower.errors import DataError

    with pytest.raises(DataError, match="is not a regular file"):
        load_corpus("/dev/null")


def test_qrels_judging_one_pair_twice_with_different_scores(tiny_beir):
    """The last row silently won: a relevant document could turn irrelevant without a word."""
    from twotower.data.beir import load_qrels
    from twotower.errors import DataError

    qrels = tiny_beir / "qrels" / "test.tsv"
    with qrels.open("a") as f:
        f.write("q1\td1\t1\n")  # the same judgement again: fine
    assert load_qrels(qrels)["q1"] == {"d1": 1}
    with qrels.open("a") as f:
        f.write("q1\td1\t0\n")
    with pytest.raises(DataError, match=r"line 6, field 'score': query 'q1' judges document 'd1' twice, with scores 1 "
                                        r"and 0"):
        load_qrels(qrels)


# ---- lengths past the model's position embeddings ---------------------------------------------------------

def test_max_length_past_the_positions(tiny_bert_dir, tmp_path, caplog):
    """--doc-max-length 1000 on a 128-position model indexed past its position embeddings: a RuntimeError
    traceback on the first long document; the default length (the tokenizer's 512) did the same. Now the
    length is cut to the model's 128 positions, with a warning: the same run as --doc-max-length 128."""
    import json as _json

    from conftest import TINY_QRELS, TINY_QUERIES, write_beir

    long_doc = {"_id": "long", "title": "", "text": "cats purr " * 400}
    data = write_beir(tmp_path / "d", [{"_id": "d1", "title": "Cats", "text": "Cats purr."},
                                       {"_id": "d4", "title": "Rust", "text": "Rust is safe."},
                                       {"_id": "d5", "title": "Tea", "text": "Tea is brewed."}, long_doc],
                      TINY_QUERIES, TINY_QRELS)
    runs = {}
    for length in ("1000", "128", None):
        out = tmp_path / f"r{length}.trec"
        extra = ["--doc-max-length", length, "--query-max-length", length] if length else []
        with caplog.at_level("WARNING"):
            res = _cli("eval", "--data", data, "--model", tiny_bert_dir, "--device", "cpu", "--precision", "fp32",
                       "--no-progress", "--run", out, *extra)
        assert res.exit_code == 0, res.output
        runs[length] = out.read_text()
    assert "max length of 1000 tokens" in caplog.text and "is cut to 128" in caplog.text
    assert runs["1000"] == runs["128"] == runs[None]


def test_latency_query_length_past_the_positions(tiny_bert_dir, tmp_path):
    res = _cli("analyze", "latency", "--model", tiny_bert_dir, "--query-length", "1000", "--runs", "1",
               "--warmup", "0", "--n-docs", "2", "--device", "cpu", "--out", tmp_path / "a", "--no-progress")
    _refused(res, "--query-length 1000 is more than the 128 positions")


@pytest.mark.parametrize("argv,message", [
    (["pretrain", "--corpus", "{t}", "--out", "{t}/r", "--momentum", "0.5"], "--negatives inbatch does not use"),
    (["pretrain", "--corpus", "{t}", "--out", "{t}/r", "--queue-size", "8"], "--negatives inbatch does not use"),
    (["pretrain", "--corpus", "{t}", "--out", "{t}/r", "--ict-keep", "0.5"], "--ict-keep applies to --augment ict"),
    (["eval", "--data", "{t}", "--rerank-depth", "5"], "--rerank-depth sets how many documents --rerank re-ranks"),
    (["search", "--index", "{t}", "cats", "--rerank-depth", "5"], "--rerank-depth sets how many hits --rerank"),
])
def test_options_of_another_mode_are_refused(tmp_path, argv, message):
    """Each was silently ignored: the run went on without what the user asked for."""
    _refused(_cli(*[a.format(t=tmp_path) for a in argv]), message)


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_train_into_an_index_directory(tiny_beir, tiny_bert_dir, tmp_path, resume):
    """A run's model/, train_log.json and train_config.json were written among the index's files."""
    index = tmp_path / "idx"
    assert _cli("index", "build", "--data", tiny_beir, "--out", index, "--model", tiny_bert_dir, "--device", "cpu",
                "--no-progress").exit_code == 0
    before = sorted(p.name for p in index.iterdir())
    res = _cli("train", "--data", tiny_beir, "--split", "test", "--out", index, "--model", tiny_bert_dir, "--steps", "1",
               "--batch-size", "2", "--device", "cpu", "--no-progress", *resume)
    _refused(res, f"--out {index} holds an index (CURRENT, versions)")
    assert sorted(p.name for p in index.iterdir()) == before
