"""Fusion functions on hand-made runs, λ tuning on dev qrels, BM25 bigrams, hybrid eval end to end."""

from __future__ import annotations

import json

import pytest

from twotower.retrieval.bm25 import BM25, BM25Params
from twotower.evaluation.tuning import tune_lambda
from twotower.retrieval.hybrid import dev_split, interpolate, minmax, rrf, truncate

DENSE = {"q1": {"a": 0.9, "b": 0.5, "c": 0.1}, "q2": {"x": 2.0, "y": 2.0}}
SPARSE = {"q1": {"c": 12.0, "d": 8.0, "a": 4.0}, "q3": {"z": 1.0}}


def test_minmax_per_query():
    assert minmax(DENSE) == {"q1": {"a": 1.0, "b": pytest.approx(0.5), "c": 0.0}, "q2": {"x": 1.0, "y": 1.0}}
    assert minmax({"q": {}}) == {"q": {}}


def test_zscore_fusion_against_scipy_and_by_hand():
    """z-score normalisation per query (scipy.stats.zscore, population sd), a missing document at that side's
    lowest z-score; on q1 by hand: dense a 1.2247, b 0, c -1.2247; sparse c 1.2247, d 0, a -1.2247."""
    from scipy.stats import zscore as scipy_z

    from twotower.retrieval.hybrid import zscore

    for q, docs in DENSE.items():
        want = scipy_z(list(docs.values())) if len(set(docs.values())) > 1 else [0.0] * len(docs)
        assert list(zscore({q: docs})[q].values()) == pytest.approx(list(want))
    fused = interpolate(DENSE, SPARSE, 0.3, norm="zscore")
    z = 1.5 ** 0.5
    assert fused["q1"] == {"a": pytest.approx(0.3 * z - 0.7 * z), "b": pytest.approx(0.0 - 0.7 * z),
                           "c": pytest.approx(-0.3 * z + 0.7 * z), "d": pytest.approx(-0.3 * z + 0.0)}
    assert fused["q1"] != interpolate(DENSE, SPARSE, 0.3)["q1"]
    assert fused["q2"] == {"x": 0.0, "y": 0.0} and fused["q3"] == {"z": 0.0}  # one document or equal scores: 0
    with pytest.raises(ValueError, match="unknown fusion normalisation 'l2'"):
        interpolate(DENSE, SPARSE, 0.3, norm="l2")


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


def test_fusion_top_k_cuts_the_fused_ranking():
    fused = interpolate(DENSE, SPARSE, 0.3, top_k=2)
    assert fused["q1"] == {"c": pytest.approx(0.7), "d": pytest.approx(0.35)}  # of a .3, b .15, c .7, d .35
    assert rrf([DENSE, SPARSE], k=60, top_k=1)["q1"] == {"a": pytest.approx(1 / 61 + 1 / 63)}  # a and c tie: a first
    assert len(rrf([DENSE, SPARSE], top_k=10)["q1"]) == 4  # fewer documents than top_k: all of them


# --------------------------------------------------------------------- --top-k K through each hybrid entry point

N_DOCS = 150
DEEP_QUERIES = {"q1": "alpha", "q2": "gamma"}


def _deep_doc(i: int) -> str:
    # every document matches both queries with its own (term frequency, length): 150 distinct BM25 scores per query
    return " ".join(["alpha"] * (1 + i % 10) + ["gamma"] * (1 + (i * 7) % 13) + ["river"] * (2 + i // 10))


@pytest.fixture(scope="module")
def deep_beir(tmp_path_factory):
    from conftest import write_beir

    corpus = [{"_id": f"d{i}", "title": "", "text": _deep_doc(i)} for i in range(N_DOCS)]
    queries = [{"_id": q, "text": t} for q, t in DEEP_QUERIES.items()]
    return write_beir(tmp_path_factory.mktemp("deep") / "deep", corpus, queries, [("q1", "d9", 1), ("q2", "d5", 1)])


@pytest.fixture(scope="module")
def full_scores(deep_beir, tiny_bert_dir):
    """Every document's dense and BM25 score for each query, computed apart from any fusion code."""
    import numpy as np

    from twotower.encoders.towers import DualEncoder, EncodeOptions

    ids, texts = [f"d{i}" for i in range(N_DOCS)], [_deep_doc(i) for i in range(N_DOCS)]
    model = DualEncoder.load(str(tiny_bert_dir))
    opts = EncodeOptions(precision="fp32", show_progress=False)
    dense = model.encode_queries(list(DEEP_QUERIES.values()), opts) @ model.encode_documents(texts, opts).T
    bm = BM25().index(ids, texts, show_progress=False)
    s, idx = bm.search(list(DEEP_QUERIES.values()), N_DOCS, show_progress=False)
    out = {}
    for qi, q in enumerate(DEEP_QUERIES):
        sparse = {ids[j]: float(v) for v, j in zip(s[qi], idx[qi])}
        assert len(set(sparse.values())) == N_DOCS  # no ties: the expected rankings below are unambiguous
        out[q] = ({ids[j]: float(dense[qi, j]) for j in range(N_DOCS)}, sparse)
    assert np.isfinite(dense).all()
    return out


def _expected(full, mode: str, depth: int, lam: float = 0.5) -> dict[str, dict[str, float]]:
    """The fused scores written out: each side's ``depth`` best, min-max (hybrid) or 1/(60 + rank) (rrf)."""
    want = {}
    for q, (dense, sparse) in full.items():
        parts = []
        for scores in (dense, sparse):
            best = sorted(scores, key=lambda d: -scores[d])[:depth]
            if mode == "hybrid":
                lo, hi = scores[best[-1]], scores[best[0]]
                parts.append({d: (scores[d] - lo) / (hi - lo) for d in best})
            else:
                parts.append({d: 1 / (60 + r) for r, d in enumerate(best, start=1)})
        weights = (lam, 1 - lam) if mode == "hybrid" else (1.0, 1.0)
        want[q] = {d: weights[0] * parts[0].get(d, 0.0) + weights[1] * parts[1].get(d, 0.0)
                   for d in {*parts[0], *parts[1]}}
    return want


def _assert_top_k_of(got: dict[str, dict[str, float]], want: dict[str, dict[str, float]], k: int) -> None:
    """``got`` holds, per query, min(k, n) documents with their expected fused scores, and those are the k best
    (documents tied at equal scores may come in either order, so scores are compared, not positions)."""
    assert set(got) == set(want)
    for q, fused in want.items():
        assert len(got[q]) == min(k, N_DOCS), q
        assert {d: got[q][d] for d in got[q]} == pytest.approx({d: fused[d] for d in got[q]}, abs=1e-5), q
        assert sorted(got[q].values(), reverse=True) == pytest.approx(sorted(fused.values(), reverse=True)[:k],
                                                                      abs=1e-5), q


@pytest.mark.parametrize("k", [120, 1000])
def test_eval_hybrid_returns_top_k_fused(deep_beir, tiny_bert_dir, full_scores, tmp_path, k):
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.evaluation.runs import read_run

    run_file = tmp_path / "h.trec"
    res = CliRunner().invoke(app, ["eval", "--data", str(deep_beir), "--retriever", "hybrid", "--model",
                                   str(tiny_bert_dir), "--precision", "fp32", "--top-k", str(k), "--run",
                                   str(run_file), "--no-progress"])
    assert res.exit_code == 0, res.output
    _assert_top_k_of(read_run(run_file), _expected(full_scores, "hybrid", depth=max(k, 100)), k)


@pytest.fixture(scope="module")
def deep_index(deep_beir, tiny_bert_dir, tmp_path_factory):
    from conftest import flat_index

    return flat_index(deep_beir, tiny_bert_dir, tmp_path_factory.mktemp("deep-index") / "index")


@pytest.mark.parametrize("mode", ["hybrid", "rrf"])
@pytest.mark.parametrize("k", [10, 120, 1000])
def test_searcher_fusion_returns_top_k(deep_index, full_scores, mode, k):
    from twotower.retrieval.searcher import Searcher

    run = Searcher(deep_index, precision="fp32").run(DEEP_QUERIES, k, mode=mode)
    _assert_top_k_of(run, _expected(full_scores, mode, depth=max(k, 100)), k)


def test_search_command_and_service_return_k_fused_hits(deep_index, full_scores):
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.retrieval.searcher import Searcher

    res = CliRunner().invoke(app, ["search", "alpha", "--index", str(deep_index), "-k", "120", "--mode", "rrf",
                                   "--json"])
    assert res.exit_code == 0, res.output
    ids = [json.loads(line)["id"] for line in res.output.splitlines()]
    # the command encodes its query as tt.Index does by default (ONNX Runtime on a CPU): compare like with like
    same = Searcher(deep_index, query_runtime="auto")
    assert len(ids) == 120 and ids == [h.doc_id for h in same.search("alpha", 120, mode="rrf")]

    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    with TestClient(create_app(deep_index, precision="fp32")) as client:
        reply = client.post("/search", json={"query": "alpha", "k": 120, "mode": "rrf"})
    assert reply.status_code == 200, reply.text
    hits = {h["id"]: h["score"] for h in reply.json()["hits"]}
    _assert_top_k_of({"q1": hits}, {"q1": _expected(full_scores, "rrf", depth=120)["q1"]}, 120)
