"""The CLI end to end on tiny data and on real SciFact (BM25 is fast enough for a test)."""

from __future__ import annotations

import json
import os
import math

import pytest
import pytrec_eval
from typer.testing import CliRunner

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir
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
    out, run_file = tmp_path / "r.json", tmp_path / "r.trec"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "dense", "--model", str(tiny_bert_dir),
                              "--out", str(out), "--run", str(run_file), "--no-progress", "--precision", "fp32"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert payload["model"] == str(tiny_bert_dir)
    assert set(payload["timings"]) == {"index_s", "encode_docs_per_s", "queries_per_s"}
    ndcg10, rankings = _tiny_dense_reference(tiny_bert_dir)
    assert payload["metrics"]["ndcg@10"] == pytest.approx(ndcg10, abs=1e-6)
    run = read_run(run_file)
    assert {q: sorted(docs, key=lambda d: -docs[d]) for q, docs in run.items()} == rankings


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
    monkeypatch.setattr(pipeline, "run_eval", lambda cfg, **kw: calls.append(cfg) or real(cfg, **kw))
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
# ----------------------------------------------------------------------------- empty splits, warnings, --model

def _no_encoding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded or a corpus indexed before the data was checked")

    monkeypatch.setattr("twotower.encoders.towers.DualEncoder.load", refuse)
    monkeypatch.setattr("twotower.retrieval.bm25.BM25.index", refuse)


@pytest.mark.parametrize("retriever", ["bm25", "dense", "hybrid"])
def test_eval_empty_queries_stops_before_encoding(tmp_path, monkeypatch, retriever):
    root = write_beir(tmp_path / "ds", TINY_CORPUS, [], TINY_QRELS)
    _no_encoding(monkeypatch)
    res = runner.invoke(app, ["eval", "--data", str(root), "--retriever", retriever, "--no-progress"])
    assert res.exit_code == 2, res.output
    assert f"{root / 'queries.jsonl'}: no queries" in res.output and "Traceback" not in res.output


def test_eval_split_without_judged_queries_stops_before_encoding(tmp_path, monkeypatch):
    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, [("nobody", "d1", 1)])
    _no_encoding(monkeypatch)
    res = runner.invoke(app, ["eval", "--data", str(root), "--retriever", "dense", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "test.tsv: none of the 1 judged queries of split 'test' is usable" in res.output


@pytest.mark.parametrize("queries, qrels, message", [
    ([], TINY_QRELS, "queries.jsonl: no queries"),
    (TINY_QUERIES, [(q, d, 0) for q, d, _ in TINY_QRELS], "train.tsv: no training pairs in split 'train'"),
])
def test_train_without_pairs_is_a_clear_error(tmp_path, tiny_bert_dir, queries, qrels, message):
    root = write_beir(tmp_path / "ds", TINY_CORPUS, queries, qrels, split="train")
    res = runner.invoke(app, ["train", "--data", str(root), "--out", str(tmp_path / "run"), "--model",
                              str(tiny_bert_dir), "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 2, res.output + repr(res.exception)
    assert message in res.output and "Traceback" not in res.output


def test_qrels_warnings_are_printed_once(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    qrels = TINY_QRELS + [("q9", "d1", 1), ("q1", "missing-doc", 1)]
    root = write_beir(tmp_path / "ds", TINY_CORPUS, TINY_QUERIES, qrels)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "twotower.cli", "eval", "--data", str(root), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("1 judged queries are not in queries.jsonl (e.g. 'q9')") == 1, proc.stderr
    assert proc.stderr.count("1 judgements name documents not in corpus.jsonl") == 1, proc.stderr


def test_model_with_bm25_is_refused_and_alone_means_dense(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch):
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "bm25", "--model", "mpnet-base",
                              "--no-progress"])
    assert res.exit_code == 2
    assert "--model mpnet-base is not used by --retriever bm25" in res.output
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--precision", "fp32",
                              "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert payload["retriever"] == "dense" and payload["model"] == str(tiny_bert_dir)
    assert payload["metrics"]["ndcg@10"] == pytest.approx(_tiny_dense_reference(tiny_bert_dir)[0], abs=1e-6)


# ----------------------------------------------------------------------------- metric values end to end

def _tiny_dense_reference(model_dir) -> tuple[float, dict[str, list[str]]]:
    """NDCG@10 of the tiny BERT on the tiny data set and each query's ranking, computed with transformers and numpy
    only: mean-pooled, L2-normalised embeddings, cosine ranking, one relevant document per query (NDCG = 1 /
    log2(rank + 1))."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(str(model_dir)), AutoModel.from_pretrained(str(model_dir)).eval()

    def embed(texts):
        batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        vecs = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    doc_ids = [d["_id"] for d in TINY_CORPUS]
    docs = embed([f"{d['title']} {d['text']}".strip() if d["title"] else d["text"] for d in TINY_CORPUS])
    queries = embed([q["text"] for q in TINY_QUERIES])
    relevant = {q: d for q, d, _ in TINY_QRELS}
    values, rankings = [], {}
    for q, scores in zip([q["_id"] for q in TINY_QUERIES], queries @ docs.T):
        rankings[q] = [doc_ids[j] for j in np.argsort(-scores)]
        rank = rankings[q].index(relevant[q]) + 1
        values.append(1 / np.log2(rank + 1) if rank <= 10 else 0.0)
    return float(np.mean(values)), rankings


def test_eval_graded_relevance_ndcg_by_hand(tmp_path):
    # four documents of four terms each: BM25 ranks by the query term's frequency
    corpus = [{"_id": "g1", "text": "alpha alpha alpha beta"}, {"_id": "g2", "text": "alpha alpha beta gamma"},
              {"_id": "g3", "text": "alpha beta gamma delta"}, {"_id": "g4", "text": "beta gamma delta epsilon"}]
    queries = [{"_id": "qa", "text": "alpha"}, {"_id": "qb", "text": "delta epsilon"}]
    qrels = [("qa", "g1", 1), ("qa", "g3", 2), ("qa", "g4", 0), ("qb", "g3", 2), ("qb", "g4", 1)]
    root = write_beir(tmp_path / "graded", corpus, queries, qrels)
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["eval", "--data", str(root), "--metrics", "ndcg@10,ndcg@1", "--out", str(out),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())["metrics"]
    log2 = math.log2
    ideal = 2 / log2(2) + 1 / log2(3)  # both queries: grades 2 and 1 judged relevant
    qa = (1 / log2(2) + 2 / log2(4)) / ideal  # ranking g1 (grade 1), g2 (unjudged), g3 (grade 2)
    qb = (1 / log2(2) + 2 / log2(3)) / ideal  # ranking g4 (grade 1), g3 (grade 2)
    assert metrics["ndcg@10"] == pytest.approx((qa + qb) / 2, abs=1e-9)  # 0.8100 (0.9599 were grades binarised)
    assert metrics["ndcg@1"] == pytest.approx((1 / 2 + 1 / 2) / 2, abs=1e-9)  # gain 1 of an ideal 2, both queries


def test_eval_ignores_a_document_whose_id_is_the_query_id(tmp_path):
    corpus = [{"_id": "q1", "text": "alpha alpha alpha beta"}, {"_id": "d2", "text": "alpha alpha beta gamma"},
              {"_id": "d3", "text": "beta gamma delta epsilon"}]
    root = write_beir(tmp_path / "self", corpus, [{"_id": "q1", "text": "alpha"}], [("q1", "d2", 1)])
    out, run_file = tmp_path / "r.json", tmp_path / "r.trec"
    res = runner.invoke(app, ["eval", "--data", str(root), "--metrics", "p@1,mrr@10", "--out", str(out),
                              "--run", str(run_file), "--no-progress"])
    assert res.exit_code == 0, res.output
    ranked = sorted(read_run(run_file)["q1"].items(), key=lambda kv: -kv[1])
    assert [d for d, _ in ranked[:2]] == ["q1", "d2"]  # BM25 does rank the query's own id first
    assert json.loads(out.read_text())["metrics"] == {"p@1": 1.0, "mrr@10": 1.0}  # 0.0 and 0.5 if it counted
