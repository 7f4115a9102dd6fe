"""twotower.analysis: formulas, projection distributions, BM25-as-vectors, and each command end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

from twotower.analysis.fidelity import (
    bm25_vectors,
    bound_k,
    margin_x,
    margins_to_all,
    normalized_margin,
    projection_block,
    projection_matrix,
)

runner = CliRunner()


def _cli(*args: str):
    from twotower.cli import app

    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


# ----------------------------------------------------------------------------- formulas


def test_normalized_margin_hand_computed():
    q = np.array([1.0, 2.0, 0.0])
    d1 = np.array([3.0, 1.0, 0.0])
    d2 = np.array([1.0, 0.0, 2.0])
    # d1 − d2 = (2, 1, −2): ⟨q, ·⟩ = 4, ‖q‖ = √5, ‖d1 − d2‖ = 3
    assert normalized_margin(q, d1, d2) == pytest.approx(4 / (3 * math.sqrt(5)))
    assert normalized_margin(q, d2, d1) == pytest.approx(-4 / (3 * math.sqrt(5)))
    # sparse rows give the same number; identical documents have no margin
    assert normalized_margin(sp.csr_matrix(q), sp.csr_matrix(d1), sp.csr_matrix(d2)) == pytest.approx(
        4 / (3 * math.sqrt(5)))
    assert math.isnan(normalized_margin(q, d1, d1))


def test_margin_x_and_bound_formula():
    eps = 0.1
    x = 1 / (eps**2 / 2 - eps**3 / 3)  # = 1/(0.005 − 0.000333…) = 214.2857…
    assert margin_x(eps) == pytest.approx(214.2857142857)
    assert bound_k(eps, beta=0.05) == pytest.approx(2 * x * math.log(80))
    assert bound_k(eps, beta=0.05) == pytest.approx(1878.0, abs=0.5)
    # the looser closed form 12·ε⁻²·ln(4/β) is always ≥ the bound for ε ≤ 1
    for e in (0.01, 0.1, 0.5, 1.0):
        assert bound_k(e, 0.05) <= 12 / e**2 * math.log(80) + 1e-9
    np.testing.assert_allclose(bound_k(np.array([0.1, 0.2]), 0.05), [bound_k(0.1), bound_k(0.2)])
    with pytest.raises(ValueError):
        bound_k(0.1, beta=1.5)


def test_margins_to_all_matches_definition():
    q = sp.csr_matrix(np.array([[1.0, 0.5, 0.0, 2.0]]))
    docs = sp.csr_matrix(np.array([[1.0, 0.0, 0.0, 1.0], [0.2, 1.0, 1.0, 0.0], [0.0, 0.0, 3.0, 0.1],
                                   [1.0, 0.0, 0.0, 1.0]]))
    from twotower.analysis.fidelity import BM25Vectors

    v = BM25Vectors(queries=q, docs=docs, idf=np.ones(4), doc_lengths=np.ones(4, dtype=int))
    scores = (q @ docs.T).toarray()
    top1 = scores.argmax(axis=1)
    mu = margins_to_all(v, top1, scores)
    assert top1[0] == 0
    assert math.isnan(mu[0, 0]) and math.isnan(mu[0, 3])  # itself, and its duplicate (d1 − d2 = 0)
    for j in (1, 2):
        assert mu[0, j] == pytest.approx(normalized_margin(q, docs[0], docs[j]))


# ----------------------------------------------------------------------------- projections


def test_gaussian_projection_scale_and_norms():
    rng = np.random.default_rng(0)
    k, v = 256, 400
    A = projection_matrix("gaussian", k, v, rng)
    assert A.shape == (k, v)
    assert A.mean() == pytest.approx(0.0, abs=0.01 / math.sqrt(k) * 10)
    assert A.std() == pytest.approx(1 / math.sqrt(k), rel=0.02)
    # E‖Ax‖² = ‖x‖²: average over many unit vectors
    x = rng.standard_normal((v, 500))
    x /= np.linalg.norm(x, axis=0)
    ratios = np.linalg.norm(A @ x, axis=0) ** 2
    assert ratios.mean() == pytest.approx(1.0, abs=0.05)
    assert ratios.std() == pytest.approx(math.sqrt(2 / k), rel=0.3)  # chi-square with k dof, scaled by 1/k


def test_rademacher_projection_is_plus_minus_one_over_sqrt_k():
    rng = np.random.default_rng(1)
    k, v = 128, 300
    A = projection_matrix("rademacher", k, v, rng)
    assert set(np.unique(np.round(A * math.sqrt(k), 6))) == {-1.0, 1.0}
    assert np.mean(A > 0) == pytest.approx(0.5, abs=0.02)
    x = rng.standard_normal((v, 400))
    x /= np.linalg.norm(x, axis=0)
    assert (np.linalg.norm(A @ x, axis=0) ** 2).mean() == pytest.approx(1.0, abs=0.05)


def test_projection_preserves_inner_products_with_larger_k():
    rng = np.random.default_rng(2)
    v = 500
    q, d = rng.standard_normal(v), rng.standard_normal(v)
    q, d = q / np.linalg.norm(q), d / np.linalg.norm(d)
    errs = {}
    for k in (16, 1024):
        vals = []
        for _ in range(40):
            A = projection_matrix("gaussian", k, v, rng)
            vals.append((A @ q) @ (A @ d))
        errs[k] = np.std(np.asarray(vals) - q @ d)
    assert errs[1024] < errs[16] / 4  # error shrinks like 1/√k: ratio ≈ 8


def test_projection_block_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown projection"):
        projection_block("sparse", 3, 3, np.random.default_rng(0))


# ----------------------------------------------------------------------------- BM25 vectors


def test_bm25_vectors_reproduce_bm25s_scores(tiny_beir):
    from twotower.data.beir import BeirDataset
    from twotower.retrieval.bm25 import BM25

    ds = BeirDataset.load(tiny_beir)
    ids = list(ds.corpus)
    texts = [ds.corpus[d].full_text for d in ids]
    queries = [ds.queries[q] for q in ds.queries] + ["cats cats purr", "programming language language rust"]
    bm = BM25().index(ids, texts, show_progress=False)
    want, idx = bm.search(queries, k=len(ids), show_progress=False)
    d_tok = bm.tokenizer.tokenize(texts, update_vocab=False, return_as="ids", show_progress=False)
    q_tok = bm.tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
    vecs = bm25_vectors(d_tok, q_tok, len(bm.tokenizer.get_vocab_dict()))
    got = (vecs.queries @ vecs.docs.T).toarray()
    np.testing.assert_allclose(np.take_along_axis(got, idx, axis=1), want, rtol=1e-5, atol=1e-6)
    # query = idf-weighted counts, document weights in (0, 1) (Lucene tf saturation)
    assert np.all((vecs.docs.data > 0) & (vecs.docs.data < 1))
    row = vecs.queries[len(ds.queries)].toarray().ravel()  # "cats cats purr"
    cat = bm.tokenizer.get_vocab_dict()["cat"]
    assert row[cat] == pytest.approx(2 * vecs.idf[cat])


def test_bm25_vectors_truncation_recomputes_statistics():
    docs = [[1, 2, 3, 4], [1, 1], [2, 5, 5, 5, 5]]
    full = bm25_vectors(docs, [[1]], 6)
    cut = bm25_vectors(docs, [[1]], 6, max_doc_tokens=2)
    assert list(cut.doc_lengths) == [2, 2, 2] and list(full.doc_lengths) == [4, 2, 5]
    assert full.idf[5] > 0 and cut.idf[5] > 0 and cut.idf[3] == 0  # token 3 is cut from doc 0
    # token 2 stays in docs 0 and 2, so its df and idf do not change
    assert cut.idf[2] == pytest.approx(full.idf[2])


# ----------------------------------------------------------------------------- commands end to end


def test_fidelity_command_tiny(tiny_beir, tmp_path):
    out = tmp_path / "a"
    _cli("analyze", "fidelity", "--data", str(tiny_beir), "--k-max", "256", "--k-step", "32",
         "--recall-ks", "64,256", "--doc-lengths", "4,full", "--draws", "2", "--no-progress", "--out", str(out))
    res = json.loads((out / "fidelity.json").read_text())
    assert res["analysis"] == "fidelity" and res["num_queries"] == 3
    assert res["num_pairs"] > 0
    assert {p for p in res["plots"]} == {"fidelity_kstar.png", "fidelity_margins.png", "fidelity_recall.png"}
    for p in res["plots"]:
        assert (out / p).stat().st_size > 10_000
    # recall values are fractions, and cannot fall as r grows
    for row in res["recall"]:
        vals = [row[f"recall@{r}"] for r in (1, 10, 100)]
        assert all(0.0 <= v <= 1.0 for v in vals) and vals == sorted(vals)
    assert [r["doc_length"] for r in res["margins_by_doc_length"]] == ["4", "full"]


def test_fidelity_kstar_matches_theory_on_synthetic_pairs(tmp_path):
    """With many pairs, k* follows x linearly and stays under the bound (Gaussian: k* ≈ 1.35–2·x)."""
    from twotower.analysis.fidelity import FidelityConfig, run_fidelity
    from conftest import write_beir

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    corpus = [{"_id": f"d{i}", "title": "", "text": " ".join(rng.choice(words, 40))} for i in range(300)]
    queries = [{"_id": f"q{i}", "text": " ".join(rng.choice(words, 5))} for i in range(150)]
    root = write_beir(tmp_path / "syn", corpus, queries, [(f"q{i}", "d0", 1) for i in range(150)])
    res = run_fidelity(FidelityConfig(data=root, k_max=2048, k_chunk=512, recall_ks=(256, 2048),
                                      doc_lengths=(None,), draws=2, n_bins=12, min_pairs_per_bin=60,
                                      pairs_per_query=150, show_progress=False))
    fit = res["kstar_fit"]["gaussian"]
    assert fit["bins_used"] >= 3
    assert fit["max_kstar_over_bound"] < 1.0
    assert 0.5 < fit["slope_through_origin"] < 4.0
    assert fit["pearson_r"] > 0.9


def test_towers_command_tiny(tiny_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "a"
    printed = _cli("analyze", "towers", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--n", "6",
                   "--perplexity", "3", "--precision", "fp32", "--no-progress", "--out", str(out)).output
    res = json.loads((out / "towers.json").read_text())
    (m,) = res["models"]
    # the results are printed as a table, not only written to towers.json
    (row,) = [line for line in printed.splitlines() if tiny_bert_dir.name in line and "wrote" not in line]
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    assert cells == [m["model"], "yes", str(m["dim"]), f"{m['probe_accuracy']:.4f}", f"{m['probe_accuracy_std']:.4f}",
                     f"{m['pair_cosine_mean']:.4f}", f"{m['centroid_cosine']:.4f}"]
    # three judged pairs; documents are filled up with three random ones, queries.jsonl has no more
    assert res["judged_pairs"] == 3 and res["num_queries"] == 3 and res["num_docs"] == 6
    assert len(m["tsne"]) == 9 and m["shared_towers"] is True
    assert 0.0 <= m["probe_accuracy"] <= 1.0
    assert (out / "towers_tsne.png").stat().st_size > 10_000


def test_linear_probe_separates_shifted_clouds_and_not_identical_ones():
    from twotower.analysis.embedding_space import linear_probe

    rng = np.random.default_rng(0)
    a = rng.standard_normal((100, 8))
    assert linear_probe(a, a + 3.0)[0] > 0.95
    assert linear_probe(a, rng.standard_normal((100, 8)))[0] < 0.75


def test_doclength_command_tiny(tiny_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "a"
    _cli("analyze", "doclength", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--top-k", "2",
         "--precision", "fp32", "--no-progress", "--out", str(out))
    res = json.loads((out / "doclength.json").read_text())
    rows = {r["system"]: r for r in res["rows"]}
    assert set(rows) == {"corpus (all documents)", "relevant documents (test qrels)", "bm25",
                         f"dense: {tiny_bert_dir.name}"}
    assert rows["bm25"]["entries"] == 4  # top 2 of the documents each query matches: q1 d1; q2 d4, d3; q3 d5
    # relevant docs d1, d4, d5 have 8, 11 and 11 words (title + text)
    assert rows["relevant documents (test qrels)"]["median_words"] == 11
    assert (out / "doclength.png").stat().st_size > 10_000


def test_latency_command_and_report(tiny_bert_dir, tiny_beir, tmp_path):
    out = tmp_path / "a"
    _cli("analyze", "latency", "--model", str(tiny_bert_dir), "--runs", "5", "--warmup", "1", "--query-length", "32",
         "--data", str(tiny_beir), "--n-docs", "6", "--doc-batch-size", "4", "--no-progress", "--out", str(out))
    res = json.loads((out / "latency.json").read_text())
    assert [r["precision"] for r in res["rows"]] == ["fp32", "auto"]
    for r in res["rows"]:
        assert r["query_tokens"] == 32 and r["runs"] == 5
        assert 0 < r["p50_ms"] <= r["p95_ms"] and r["docs_per_s"] > 0
    (out / "notes.json").write_text('{"unrelated": true}')  # JSON that is not an analysis is skipped
    _cli("analyze", "report", "--out", str(out))
    page = (out / "report.md").read_text()
    assert "## Batch-1 query latency" in page and "![latency.png](latency.png)" in page
    assert "unrelated" not in page


def test_report_errors_name_the_folder_and_file(tmp_path):
    from twotower.analysis.report import build_report
    from twotower.errors import DataError, TwoTowerError

    with pytest.raises(TwoTowerError, match="no analysis JSON"):
        build_report(tmp_path)
    (tmp_path / "fidelity.json").write_text("{not json")
    with pytest.raises(DataError, match="fidelity.json, line 1"):
        build_report(tmp_path)


# ----------------------------------------------------------------------------- real data


@pytest.mark.slow
def test_fidelity_on_scifact_small(scifact):
    from twotower.analysis.fidelity import FidelityConfig, run_fidelity

    res = run_fidelity(FidelityConfig(data=scifact, max_queries=60, k_max=1024, recall_ks=(256, 1024),
                                      doc_lengths=(32, None), draws=1, min_pairs_per_bin=30, show_progress=False))
    assert res["num_queries"] == 60
    fit = res["kstar_fit"]["gaussian"]
    assert fit["max_kstar_over_bound"] < 1.0
    short, full = res["margins_by_doc_length"]
    assert short["margin_100th_median"] > full["margin_100th_median"]
