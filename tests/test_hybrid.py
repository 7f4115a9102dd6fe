"""Fusion functions on hand-made runs, λ tuning on dev qrels, BM25 bigrams, hybrid eval end to end."""

from __future__ import annotations

import json

import pytest

from twotower.retrieval.bm25 import BM25, BM25Params
from twotower.retrieval.hybrid import dev_split, interpolate, minmax, rrf, truncate, tune_lambda

DENSE = {"q1": {"a": 0.9, "b": 0.5, "c": 0.1}, "q2": {"x": 2.0, "y": 2.0}}
SPARSE = {"q1": {"c": 12.0, "d": 8.0, "a": 4.0}, "q3": {"z": 1.0}}


def test_minmax_per_query():
    assert minmax(DENSE) == {"q1": {"a": 1.0, "b": pytest.approx(0.5), "c": 0.0}, "q2": {"x": 1.0, "y": 1.0}}
    assert minmax({"q": {}}) == {"q": {}}


def test_truncate_keeps_best():
    assert truncate(SPARSE, 2)["q1"] == {"c": 12.0, "d": 8.0}


def test_interpolate_union_of_n_bests():
    fused = interpolate(DENSE, SPARSE, 0.3)
    # q1: dense minmax a 1, b .5, c 0; sparse minmax c 1, d .5, a 0; missing -> 0
    assert fused["q1"] == {
        "a": pytest.approx(0.3 * 1.0), "b": pytest.approx(0.3 * 0.5), "c": pytest.approx(0.7 * 1.0),
        "d": pytest.approx(0.7 * 0.5),
    }
    assert fused["q2"] == {"x": pytest.approx(0.3), "y": pytest.approx(0.3)}
    assert fused["q3"] == {"z": pytest.approx(0.7)}
    # n_best=1: only each system's top document takes part
    assert set(interpolate(DENSE, SPARSE, 0.5, n_best=1)["q1"]) == {"a", "c"}
    assert interpolate(DENSE, SPARSE, 1.0)["q1"]["d"] == 0.0
    with pytest.raises(ValueError, match="lambda must be in \\[0, 1\\], got 1.5"):
        interpolate(DENSE, SPARSE, 1.5)


def test_rrf_by_hand():
    fused = rrf([DENSE, SPARSE], k=60)
    assert fused["q1"]["a"] == pytest.approx(1 / 61 + 1 / 63)
    assert fused["q1"]["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert fused["q1"]["d"] == pytest.approx(1 / 62)
    assert fused["q2"] == {"x": pytest.approx(1 / 61), "y": pytest.approx(1 / 62)}  # ties: by id
    assert rrf([DENSE, SPARSE], k=60, weights=[2.0, 0.0])["q1"]["a"] == pytest.approx(2 / 61)
    with pytest.raises(ValueError, match="2 runs but 1 weights"):
        rrf([DENSE, SPARSE], weights=[1.0])


def test_tune_lambda_picks_the_better_system():
    qrels = {"q1": {"c": 1}}  # sparse ranks c first, dense last
    best, table = tune_lambda(DENSE, SPARSE, qrels, grid=[0.0, 0.8, 1.0])
    assert best == 0.0 and table[0.0] == 1.0 and table[0.8] < 1.0 and table[1.0] < 1.0
    qrels = {"q1": {"a": 1}}
    assert tune_lambda(DENSE, SPARSE, qrels, grid=[0.0, 0.2, 1.0])[0] == 1.0
    with pytest.raises(ValueError, match="no query of the runs is judged"):
        tune_lambda(DENSE, SPARSE, {"nope": {"a": 1}})


def test_dev_split_is_reproducible_and_disjoint():
    ids = [f"q{i}" for i in range(100)]
    dev, rest = dev_split(ids, 0.3, seed=1)
    assert len(dev) == 30 and len(rest) == 70 and not set(dev) & set(rest)
    assert dev_split(reversed(ids), 0.3, seed=1) == (dev, rest)
    assert dev_split(ids, 0.3, seed=2)[0] != dev


def test_bm25_bigrams_reward_phrases():
    docs = ["york new is old and big", "new york city is big", "cats sleep"]
    uni = BM25(BM25Params(ngram=1)).index(["a", "b", "c"], docs, show_progress=False)
    bi = BM25(BM25Params(ngram=2)).index(["a", "b", "c"], docs, show_progress=False)
    s_uni, i_uni = uni.search(["new york"], k=3, show_progress=False)
    s_bi, i_bi = bi.search(["new york"], k=3, show_progress=False)
    assert i_bi[0, 0] == 1  # the phrase wins only with bigrams
    assert s_bi[0, 0] > s_uni[0, list(i_uni[0]).index(1)]
    s, _ = bi.search(["zzzz qqqq"], k=2, show_progress=False)
    assert (s == 0).all()
    with pytest.raises(ValueError, match="BM25 ngram must be 1 or 2, got 3"):
        BM25(BM25Params(ngram=3))


def test_bm25_bigram_save_load(tmp_path):
    docs = ["new york city", "york new", "cats"]
    bi = BM25(BM25Params(ngram=2)).index(["a", "b", "c"], docs, show_progress=False)
    bi.save(tmp_path / "bm")
    again = BM25.load(tmp_path / "bm", ["a", "b", "c"], BM25Params(ngram=2))
    for q in ("new york", "york new city"):
        a, b = bi.search([q], k=3, show_progress=False), again.search([q], k=3, show_progress=False)
        assert a[1].tolist() == b[1].tolist() and a[0][0].tolist() == pytest.approx(b[0][0].tolist())


def test_eval_hybrid_tiny(tiny_beir, tiny_bert_dir, tmp_path):
    from typer.testing import CliRunner

    from twotower.cli import app

    out = tmp_path / "h.json"
    res = CliRunner().invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "hybrid", "--model",
                                   str(tiny_bert_dir), "--precision", "fp32", "--lambda", "0", "--out", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert payload["retriever"] == "hybrid" and payload["metrics"]["p@1"] == 1.0  # λ=0: BM25 order
