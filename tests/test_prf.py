"""Dense pseudo-relevance feedback (retrieval.prf): Rocchio by hand, and its wiring through eval, the Searcher and
the search command, each checked against rankings computed here from the model's vectors with numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from twotower.cli import app
from twotower.errors import TwoTowerError
from twotower.retrieval.prf import check_prf, feedback_rows, rocchio, search_with_feedback

N_DOCS = 40
QUERIES = {"q1": "alpha river", "q2": "gamma stone"}
DEPTH, WEIGHT = 3, 2.0


def _doc(i: int) -> str:
    words = ["alpha", "gamma", "river", "stone", "cloud"]
    return " ".join(words[(i * j) % 5] for j in range(1, 3 + i % 7))


def test_rocchio_by_hand():
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    fb = np.array([[[0.0, 1.0], [0.0, 3.0]]], dtype=np.float32)  # mean (0, 2)
    np.testing.assert_allclose(rocchio(q, fb, 1.0), [[0.5, 1.0]])  # (q + 1·mean) / 2
    np.testing.assert_allclose(rocchio(q, fb, 3.0), [[0.25, 1.5]])  # (q + 3·mean) / 4
    with pytest.raises(ValueError):
        rocchio(q, fb[:, :, :1], 1.0)


def test_search_with_feedback_against_numpy():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(200, 8)).astype(np.float32)
    qs = rng.normal(size=(5, 8)).astype(np.float32)
    scores, idx = search_with_feedback(qs, docs, 10, 4, 0.5)
    for q, s, i in zip(qs, scores, idx):
        first = np.argsort(-(docs @ q))[:4]
        moved = (q + 0.5 * docs[first].mean(0)) / 1.5
        want = docs @ moved
        np.testing.assert_array_equal(i, np.argsort(-want)[:10])
        np.testing.assert_allclose(s, np.sort(want)[::-1][:10], rtol=1e-5)


def test_bad_settings_are_refused():
    # Python names the parameters (prf_depth=0); the CLI its flags: test_eval_refuses_bad_feedback_options
    with pytest.raises(TwoTowerError, match="^prf_depth=0: "):
        check_prf(0, None)
    for w in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(TwoTowerError, match=f"^prf_weight={w}: "):
            check_prf(3, w)
    with pytest.raises(TwoTowerError, match="^prf_weight needs prf_depth "):
        check_prf(None, 1.0)
    with pytest.raises(TwoTowerError, match=r"mode='bm25' has none: drop it or pass mode='dense' \| 'hybrid' \| 'rrf'"):
        check_prf(3, None, mode="bm25", mode_option="--retriever")
    with pytest.raises(TwoTowerError, match=r"lower prf_depth\)"):
        feedback_rows(np.array([[3, -1]]), 2)
    with pytest.raises(TwoTowerError, match="only 4 documents"):
        search_with_feedback(np.ones((1, 2), np.float32), np.ones((4, 2), np.float32), 3, 5, 1.0)


# --------------------------------------------------------------------- wiring, against numpy on the model's vectors


@pytest.fixture(scope="module")
def prf_beir(tmp_path_factory):
    from conftest import write_beir

    corpus = [{"_id": f"d{i}", "title": "", "text": _doc(i)} for i in range(N_DOCS)]
    queries = [{"_id": q, "text": t} for q, t in QUERIES.items()]
    return write_beir(tmp_path_factory.mktemp("prf") / "prf", corpus, queries, [("q1", "d3", 1), ("q2", "d5", 1)])


@pytest.fixture(scope="module")
def reference(tiny_bert_dir):
    """Per query: every document's score after feedback, and without it, from the model's own vectors."""
    from twotower.encoders.towers import DualEncoder, EncodeOptions

    model = DualEncoder.load(str(tiny_bert_dir))
    opts = EncodeOptions(precision="fp32", show_progress=False)
    docs = model.encode_documents([_doc(i) for i in range(N_DOCS)], opts)
    out = {}
    for q, v in zip(QUERIES, model.encode_queries(list(QUERIES.values()), opts)):
        plain = docs @ v
        moved = (v + WEIGHT * docs[np.argsort(-plain)[:DEPTH]].mean(0)) / (1 + WEIGHT)
        out[q] = ({f"d{j}": float(s) for j, s in enumerate(docs @ moved)}, {f"d{j}": float(s) for j, s in enumerate(plain)})
    # the feedback must change the scores, or the tests below could not tell it was applied
    assert all(not np.allclose(list(a.values()), list(b.values()), atol=1e-4) for a, b in out.values())
    return out


def _assert_top(got: dict[str, dict[str, float]], reference, k: int) -> None:
    for q, (moved, _) in reference.items():
        assert len(got[q]) == k
        assert got[q] == pytest.approx({d: moved[d] for d in got[q]}, abs=1e-4), q
        assert sorted(got[q].values(), reverse=True) == pytest.approx(sorted(moved.values(), reverse=True)[:k], abs=1e-4)


def test_eval_applies_feedback(prf_beir, tiny_bert_dir, reference, tmp_path):
    from twotower.evaluation.runs import read_run

    run_file, out = tmp_path / "prf.trec", tmp_path / "prf.json"
    res = CliRunner().invoke(app, ["eval", "--data", str(prf_beir), "--model", str(tiny_bert_dir), "--retriever",
                                   "dense", "--precision", "fp32", "--top-k", "10", "--prf-depth", str(DEPTH),
                                   "--prf-weight", str(WEIGHT), "--run", str(run_file), "--out", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    _assert_top(read_run(run_file), reference, 10)
    assert json.loads(out.read_text())["prf"] == {"depth": DEPTH, "weight": WEIGHT}


@pytest.fixture(scope="module")
def prf_index(prf_beir, tiny_bert_dir, tmp_path_factory):
    from conftest import flat_index

    return flat_index(prf_beir, tiny_bert_dir, tmp_path_factory.mktemp("prf-index") / "index")


def test_searcher_and_search_command_apply_feedback(prf_index, reference):
    from twotower.retrieval.searcher import Searcher

    searcher = Searcher(prf_index, precision="fp32")
    _assert_top(searcher.run(QUERIES, 10, mode="dense", prf_depth=DEPTH, prf_weight=WEIGHT), reference, 10)
    res = CliRunner().invoke(app, ["search", QUERIES["q1"], "--index", str(prf_index), "--mode", "dense", "-k", "5",
                                   "--prf-depth", str(DEPTH), "--prf-weight", str(WEIGHT), "--json"])
    assert res.exit_code == 0, res.output
    hits = [json.loads(line) for line in res.output.splitlines()]
    moved = reference["q1"][0]
    assert [h["score"] for h in hits] == pytest.approx(sorted(moved.values(), reverse=True)[:5], abs=1e-4)


def test_hybrid_feedback_is_the_same_through_eval_and_the_searcher(prf_beir, prf_index, tiny_bert_dir, tmp_path):
    """The dense side of a hybrid gets the feedback on both paths (and it changes the fused ranking)."""
    from twotower.evaluation.runs import read_run
    from twotower.retrieval.searcher import Searcher

    runs = {}
    for name, extra in (("prf", ["--prf-depth", str(DEPTH), "--prf-weight", str(WEIGHT)]), ("plain", [])):
        f = tmp_path / f"{name}.trec"
        res = CliRunner().invoke(app, ["eval", "--data", str(prf_beir), "--model", str(tiny_bert_dir), "--retriever",
                                       "hybrid", "--precision", "fp32", "--top-k", "10", "--run", str(f),
                                       "--no-progress", *extra])
        assert res.exit_code == 0, res.output
        runs[name] = read_run(f)
    searched = Searcher(prf_index, precision="fp32").run(QUERIES, 10, mode="hybrid", prf_depth=DEPTH,
                                                         prf_weight=WEIGHT)
    for q in QUERIES:
        assert searched[q] == pytest.approx(runs["prf"][q], abs=1e-4)
    assert any(runs["prf"][q] != pytest.approx(runs["plain"][q], abs=1e-4) for q in QUERIES)


@pytest.mark.parametrize("args, message", [
    (["--prf-depth", "0"], "--prf-depth 0"),
    (["--prf-depth", "3", "--prf-weight", "-1"], "--prf-weight -1"),
    (["--prf-weight", "2"], "needs --prf-depth"),
    (["--retriever", "bm25", "--prf-depth", "3"], "--retriever bm25 has none"),
    (["--retriever", "multivector", "--prf-depth", "3"], "--retriever multivector has none"),
])
def test_eval_refuses_bad_feedback_options(prf_beir, args, message):
    res = CliRunner().invoke(app, ["eval", "--data", str(prf_beir), "--no-progress", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_search_refuses_feedback_without_dense(prf_index):
    res = CliRunner().invoke(app, ["search", "alpha", "--index", str(prf_index), "--mode", "bm25", "--prf-depth", "3"])
    assert res.exit_code == 2 and "--mode bm25 has none" in res.output


def test_feedback_deeper_than_the_corpus_is_refused(prf_beir, prf_index, tiny_bert_dir):
    res = CliRunner().invoke(app, ["search", "alpha", "--index", str(prf_index), "--mode", "dense", "--prf-depth",
                                   str(N_DOCS + 1)])
    assert res.exit_code == 2 and "lower --prf-depth" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["eval", "--data", str(prf_beir), "--model", str(tiny_bert_dir), "--retriever",
                                   "dense", "--prf-depth", str(N_DOCS + 1), "--no-progress"])
    assert res.exit_code == 2 and f"only {N_DOCS} documents" in res.output and "Traceback" not in res.output


def test_service_applies_feedback_and_refuses_bad_values(prf_index, reference):
    from fastapi.testclient import TestClient

    from twotower.serve.app import create_app

    client = TestClient(create_app(prf_index, precision="fp32"))
    body = {"query": QUERIES["q2"], "k": 5, "mode": "dense", "prf_depth": DEPTH, "prf_weight": WEIGHT}
    hits = client.post("/search", json=body).json()["hits"]
    moved = reference["q2"][0]
    assert {h["id"]: h["score"] for h in hits} == pytest.approx({h["id"]: moved[h["id"]] for h in hits}, abs=1e-4)
    assert [h["score"] for h in hits] == pytest.approx(sorted(moved.values(), reverse=True)[:5], abs=1e-4)
    batch = client.post("/search/batch", json={"queries": list(QUERIES.values()), "k": 5, "mode": "dense",
                                               "prf_depth": DEPTH, "prf_weight": WEIGHT}).json()["results"]
    # the same hits in a batch (its padded encoding moves scores by float noise only, here ~1e-7)
    assert [h["id"] for h in batch[1]] == [h["id"] for h in hits]
    assert [h["score"] for h in batch[1]] == pytest.approx([h["score"] for h in hits], abs=1e-5)
    for bad, status in (({"prf_depth": 0}, 422), ({"prf_depth": 3, "prf_weight": 0}, 422),
                        ({"prf_depth": 3, "prf_weight": -2}, 422), ({"prf_depth": 3, "mode": "bm25"}, 400),
                        ({"prf_depth": N_DOCS + 1, "mode": "dense"}, 400)):
        r = client.post("/search", json={"query": "alpha", **bad})
        assert r.status_code == status, (bad, r.text)
        assert r.json()["error"]
