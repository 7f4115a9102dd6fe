"""Metrics follow BEIR conventions and agree with pytrec_eval on written run files."""

from __future__ import annotations

import math

import pytest
import pytrec_eval

from twotower.evaluation.metrics import evaluate, per_query
from twotower.evaluation.runs import read_run, write_run
from twotower.errors import DataError

QRELS = {"q1": {"a": 1, "c": 1}, "q2": {"x": 1}}
RUN = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"y": 5.0, "x": 4.0}}


def test_hand_computed_values():
    m = evaluate(QRELS, RUN, ("ndcg@10", "mrr@10", "p@1", "recall@1", "acc@1"))
    idcg1 = 1 + 1 / math.log2(3)
    ndcg1 = (1 + 1 / math.log2(4)) / idcg1
    ndcg2 = (1 / math.log2(3)) / 1
    assert m["ndcg@10"] == pytest.approx((ndcg1 + ndcg2) / 2)
    assert m["mrr@10"] == pytest.approx((1 + 0.5) / 2)
    assert m["p@1"] == pytest.approx(0.5)
    assert m["recall@1"] == pytest.approx((0.5 + 0) / 2)
    assert m["acc@1"] == pytest.approx(0.5)


def test_graded_ndcg_by_hand():
    qrels = {"q": {"a": 2, "b": 0, "c": 1, "e": 2}}  # e is never retrieved
    run = {"q": {"b": 4.0, "c": 3.0, "a": 2.0, "d": 1.0}}
    dcg = 0 / math.log2(2) + 1 / math.log2(3) + 2 / math.log2(4)  # gains are the grades (trec_eval's ndcg_cut)
    ideal = 2 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    m = evaluate(qrels, run, ("ndcg@10", "ndcg@3", "recall@10"))
    assert m["ndcg@10"] == pytest.approx(dcg / ideal) and m["ndcg@3"] == pytest.approx(dcg / ideal)
    assert m["recall@10"] == pytest.approx(2 / 3)  # grade 0 is not relevant


def test_mrr_is_cut_at_k():
    run = {"q2": {f"n{i}": 100.0 - i for i in range(10)} | {"x": 1.0}}
    assert evaluate({"q2": {"x": 1}}, run, ("mrr@10",))["mrr@10"] == 0.0
    assert evaluate({"q2": {"x": 1}}, run, ("mrr@11",))["mrr@11"] == pytest.approx(1 / 11)


def test_identical_ids_ignored():
    run = {"q1": {"q1": 9.0, "a": 3.0}}
    assert evaluate({"q1": {"a": 1}}, run, ("p@1",))["p@1"] == 1.0
    assert evaluate({"q1": {"a": 1}}, run, ("p@1",), ignore_identical_ids=False)["p@1"] == 0.0


def test_unretrieved_judged_query_counts_zero():
    pq = per_query(QRELS, {"q1": RUN["q1"]}, ("ndcg@10",))
    assert pq["ndcg@10"]["q2"] == 0.0


def test_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric 'foo@3'"):
        evaluate(QRELS, RUN, ("foo@3",))


def test_run_file_round_trip(tmp_path):
    path = tmp_path / "run.trec"
    write_run(RUN, path, tag="t")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 a 1 3 t" and lines[-1] == "q2 Q0 x 2 4 t"
    assert read_run(path) == RUN


def test_bad_run_file(tmp_path):
    path = tmp_path / "bad.trec"
    path.write_text("q1 Q0 a 1 3.0 t\nq1 Q0 b 2 notanumber t\n")
    with pytest.raises(DataError, match=r"line 2, field 'score': score must be a number, got 'notanumber'"):
        read_run(path)


def test_matches_pytrec_eval_on_file(tmp_path):
    path = tmp_path / "run.trec"
    write_run(RUN, path)
    ev = pytrec_eval.RelevanceEvaluator(QRELS, {"ndcg_cut.10", "recall.100"}).evaluate(read_run(path))
    ours = evaluate(QRELS, RUN, ("ndcg@10", "recall@100"))
    assert ours["ndcg@10"] == pytest.approx(sum(r["ndcg_cut_10"] for r in ev.values()) / 2)
    assert ours["recall@100"] == pytest.approx(sum(r["recall_100"] for r in ev.values()) / 2)
