"""Issue #71 item 10: one model, one number. ``tt.evaluate`` on an index built with ``tt.Index.build`` and
``twotower eval --retriever dense`` make the same choices when given the same ones (equal nDCG@10 on a SciFact
slice), and both outputs state the choices two numbers can differ in: mode, query runtime, precision, passages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import write_beir
from twotower.cli import app

N_DOCS = 60


@pytest.fixture(scope="module")
def scifact_slice(scifact, tmp_path_factory) -> Path:
    """SciFact's first test queries whose relevant documents all fit in ``N_DOCS`` documents (theirs, then filler
    in corpus order), as a BEIR folder."""
    corpus = {}
    with open(scifact / "corpus.jsonl") as f:
        for line in f:
            doc = json.loads(line)
            corpus[doc["_id"]] = doc
    queries = {}
    with open(scifact / "queries.jsonl") as f:
        for line in f:
            q = json.loads(line)
            queries[q["_id"]] = q
    qrels: dict[str, dict[str, int]] = {}
    for line in (scifact / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, s = line.split("\t")
        qrels.setdefault(q, {})[d] = int(s)
    docs: list[str] = []
    chosen: list[str] = []
    for q, rels in qrels.items():
        new = [d for d in rels if d not in docs and d in corpus]
        if q not in queries or len(docs) + len(new) > N_DOCS // 2:
            continue
        docs += new
        chosen.append(q)
    docs += [d for d in corpus if d not in docs][: N_DOCS - len(docs)]
    root = tmp_path_factory.mktemp("scifact-slice") / "scifact"
    return write_beir(root, [corpus[d] for d in docs], [queries[q] for q in chosen],
                      [(q, d, s) for q in chosen for d, s in qrels[q].items()])


@pytest.fixture(scope="module")
def built(scifact_slice, tmp_path_factory) -> Path:
    import twotower as tt

    path = tmp_path_factory.mktemp("choices") / "index"
    tt.Index.build(path, scifact_slice, precision="fp32", show_progress=False)
    return path


def _cli_eval(data: Path, out: Path, *args: str) -> tuple[dict, str]:
    res = CliRunner().invoke(app, ["eval", "--data", str(data), "--metrics", "ndcg@10", "--no-progress",
                                   "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.output


def test_index_and_cli_dense_give_one_number_and_say_their_choices(built, scifact_slice, tmp_path):
    import twotower as tt

    # the Index's own precision is what evaluates it (not the evaluation's auto, bf16 on a CPU with fast bf16)
    api = tt.evaluate(tt.Index.open(built, precision="fp32"), scifact_slice, metrics=["ndcg@10"], mode="dense")
    row, printed = _cli_eval(scifact_slice, tmp_path / "dense.json", "--retriever", "dense", "--precision", "fp32",
                             "--runtime", "torch")
    assert api.num_queries >= 10
    assert api.metrics["ndcg@10"] == pytest.approx(row["metrics"]["ndcg@10"], abs=1e-6)
    expected = {"mode": "dense", "query_runtime": "torch", "precision": "fp32", "passages": True}
    assert api.choices == expected
    assert {k: api.to_json()[k] for k in expected} == expected
    assert {k: row[k] for k in expected} == expected
    assert "mode dense; query_runtime/precision torch fp32; passages on" in printed
    shown = CliRunner().invoke(app, ["table", str(tmp_path / "dense.json")])  # and where results are compared
    assert shown.exit_code == 0 and "dense.json: mode dense; query_runtime/precision torch fp32; passages on" in \
        " ".join(shown.output.split()), shown.output


def test_the_choices_that_differ_are_stated(built, scifact_slice, tmp_path):
    import twotower as tt

    # the CLI's first windows only, against the index's passages: each output says which it did
    row, printed = _cli_eval(scifact_slice, tmp_path / "first.json", "--retriever", "dense", "--precision", "fp32",
                             "--no-passages")
    assert row["passages"] is False and "passages off" in printed
    assert tt.evaluate(tt.Index.open(built), scifact_slice, metrics=["ndcg@10"], precision="fp32").passages is True
    # an index is evaluated as its searches run with no options: hybrid where it has BM25 (stated), scoring what
    # mode="hybrid" scores
    index = tt.Index.open(built)
    default = tt.evaluate(index, scifact_slice, metrics=["ndcg@10"], precision="fp32")
    hybrid = tt.evaluate(index, scifact_slice, metrics=["ndcg@10"], mode="hybrid", precision="fp32")
    assert index.resolve()[0] == default.mode == "hybrid" and default.to_json()["mode"] == "hybrid"
    assert default.metrics["ndcg@10"] == hybrid.metrics["ndcg@10"]
    # the default twotower eval (no model) is BM25: no encoder, no runtime or precision to state
    row, printed = _cli_eval(scifact_slice, tmp_path / "bm25.json")
    assert row["mode"] == "bm25" and row["query_runtime"] is None and row["precision"] is None
    assert "mode bm25" in printed
