"""The CLI end to end on tiny data and on real SciFact (BM25 is fast enough for a test)."""

from __future__ import annotations

import json
import os

import pytest
import pytrec_eval
from typer.testing import CliRunner

from twotower.cli import app
from twotower.data.beir import load_qrels
from twotower.evaluation.runs import read_run

runner = CliRunner()


def test_eval_bm25_tiny(tiny_beir, tmp_path):
    out, run = tmp_path / "r.json", tmp_path / "r.trec"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "bm25", "--out", str(out),
                              "--run", str(run), "--no-progress"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert payload["retriever"] == "bm25" and payload["num_queries"] == 3
    assert set(payload["metrics"]) == {"ndcg@10", "recall@100", "mrr@10", "p@1", "recall@1000"}
    assert set(payload["timings"]) == {"index_s", "queries_per_s"}
    assert payload["metrics"]["p@1"] == 1.0
    assert "ndcg@10" in res.output


def test_eval_dense_tiny_model(tiny_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "dense", "--model", str(tiny_bert_dir),
                              "--out", str(out), "--no-progress", "--precision", "fp32"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert payload["model"] == str(tiny_bert_dir)
    assert set(payload["timings"]) == {"index_s", "encode_docs_per_s", "queries_per_s"}


def test_bad_data_gives_message_not_traceback(tiny_beir):
    (tiny_beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": 5}\n')
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--no-progress"])
    assert res.exit_code == 2
    assert "line 2, field 'text': text must be a string, got int" in res.output
    assert "Traceback" not in res.output


def test_unknown_retriever(tiny_beir):
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "magic", "--no-progress"])
    assert res.exit_code == 2 and "unknown retriever 'magic'" in res.output


def test_data_locate_missing_folder_offline(tmp_path, monkeypatch):
    monkeypatch.setattr("twotower.data.fetch.BEIR_URL", "http://127.0.0.1:9/{name}.zip")
    res = runner.invoke(app, ["data", "locate", str(tmp_path / "nowhere" / "scifact"), "--cache", str(tmp_path / "c")])
    assert res.exit_code == 2
    assert "Without network access, put the BEIR 'scifact' directory" in res.output


@pytest.mark.slow
def test_bm25_scifact_metrics_equal_pytrec_eval_on_run_file(scifact, tmp_path):
    out, run = tmp_path / "r.json", tmp_path / "r.trec"
    res = runner.invoke(app, ["eval", "--data", str(scifact), "--retriever", "bm25", "--out", str(out),
                              "--run", str(run), "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["ndcg@10"] >= 0.66
    qrels = load_qrels(scifact / "qrels" / "test.tsv")
    trec = read_run(run)
    trec = {q: {d: s for d, s in docs.items() if d != q} for q, docs in trec.items()}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "recall.1000", "P.1"}).evaluate(trec)
    mean = lambda key: sum(r[key] for r in ev.values()) / len(qrels)  # noqa: E731
    assert metrics["ndcg@10"] == pytest.approx(mean("ndcg_cut_10"), abs=1e-9)
    assert metrics["recall@100"] == pytest.approx(mean("recall_100"), abs=1e-9)
    assert metrics["recall@1000"] == pytest.approx(mean("recall_1000"), abs=1e-9)
    assert metrics["p@1"] == pytest.approx(mean("P_1"), abs=1e-9)


def test_eval_top_k_accuracy_metric(tiny_beir, tmp_path):
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--metrics", "acc@1,acc@5,ndcg@10", "--out", str(out),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())["metrics"]
    assert list(metrics) == ["acc@1", "acc@5", "ndcg@10"]
    assert metrics["acc@1"] == 1.0 and metrics["acc@5"] == 1.0
    bad = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--metrics", "zap@3", "--no-progress"])
    assert bad.exit_code == 2 and "unknown metric 'zap@3'" in bad.output


# ---- output options are checked before any work ------------------------------------------------


def _bad_outputs(tmp_path):
    """Things an output option must not replace or write into, by name."""
    folder = tmp_path / "a-folder"
    (folder / "keep").mkdir(parents=True)
    afile = tmp_path / "a-file"
    afile.write_text("keep me\n")
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    link = tmp_path / "a-link"
    link.symlink_to(folder, target_is_directory=True)
    return {"folder": folder, "file": afile, "fifo": fifo, "link": link}


# (command line with {out} for the bad output and {missing} for input that does not exist, what is bad, message)
OUTPUT_CASES = [
    (["eval", "--data", "{missing}", "--out", "{out}"], "folder", "--out {out} exists and is a directory"),
    (["eval", "--data", "{missing}", "--run", "{out}"], "fifo", "--run {out} exists and is a FIFO"),
    (["mine", "--data", "{missing}", "--out", "{out}"], "folder", "--out {out} exists and is a directory"),
    (["train", "--data", "{missing}", "--out", "{out}"], "file", "--out {out} exists and is a regular file, not a dir"),
    (["pretrain", "--corpus", "{missing}", "--out", "{out}"], "fifo", "--out {out} exists and is a FIFO"),
    (["index", "build", "--data", "{missing}", "--out", "{out}"], "file", "--out {out} exists and is a regular file"),
    (["train-reranker", "--data", "{missing}", "--out", "{out}"], "link", "--out {out} is a symbolic link"),
    (["analyze", "fidelity", "--data", "{missing}", "--out", "{out}"], "fifo", "--out {out} exists and is a FIFO"),
    (["analyze", "towers", "--data", "{missing}", "--out", "{out}"], "file", "--out {out} exists and is a regular"),
    (["analyze", "doclength", "--data", "{missing}", "--out", "{out}"], "file", "--out {out} exists and is a regular"),
    (["analyze", "latency", "--model", "{missing}", "--out", "{out}"], "fifo", "--out {out} exists and is a FIFO"),
    (["analyze", "report", "--out", "{missing}", "--page", "{out}"], "folder", "--page {out} exists and is a directory"),
]


@pytest.mark.parametrize("argv,bad,message", OUTPUT_CASES,
                         ids=[" ".join(a for a in c[0][:2] if not a.startswith("-")) + f" {c[1]}" for c in OUTPUT_CASES])
def test_output_options_are_checked_before_any_work(tmp_path, argv, bad, message):
    outputs = _bad_outputs(tmp_path)
    out, missing = outputs[bad], tmp_path / "missing"
    before = {name: (os.lstat(p).st_mode, os.lstat(p).st_ino) for name, p in outputs.items()}
    no_progress = [] if argv[:2] == ["analyze", "report"] else ["--no-progress"]
    res = runner.invoke(app, [a.format(out=out, missing=missing) for a in argv] + no_progress)
    # the complaint is about the output: it came before the inputs were looked at (they do not exist)
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())  # rich wraps long lines
    assert message.format(out=out) in flat, res.output
    assert "Traceback" not in res.output
    assert {name: (os.lstat(p).st_mode, os.lstat(p).st_ino) for name, p in outputs.items()} == before
    assert outputs["file"].read_text() == "keep me\n" and (outputs["folder"] / "keep").is_dir()


def test_eval_out_naming_a_folder_fails_before_the_evaluation(tiny_beir, tmp_path, monkeypatch):
    calls = []
    import twotower.evaluation.pipeline as pipeline

    real = pipeline.run_eval
    monkeypatch.setattr(pipeline, "run_eval", lambda cfg: calls.append(cfg) or real(cfg))
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--out", str(tmp_path), "--no-progress"])
    assert res.exit_code == 2 and "exists and is a directory" in " ".join(res.output.split()), res.output
    assert calls == []  # nothing was evaluated (and lost)
    same = tmp_path / "r.out"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--out", str(same), "--run", str(same), "--no-progress"])
    assert res.exit_code == 2 and "--out and --run both name" in res.output and calls == [] and not same.exists()
    ok = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--out", str(tmp_path / "new" / "r.json"),
                             "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert len(calls) == 1 and json.loads((tmp_path / "new" / "r.json").read_text())["num_queries"] == 3
