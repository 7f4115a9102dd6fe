"""benchmarks/multivector_long.py: ME-BERT per passage keeps each passage's first m token vectors, grouped by
document, so that a document scores by its best vector over all its passages; the plot is written."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def mvl():
    return benchmark_module("multivector_long")


def test_per_passage_tokens_keeps_first_m_of_each_passage(mvl):
    # three passages with 3, 1 and 4 token vectors (rows 0-2, 3, 4-7); document 0 owns passages 0-1, document 1
    # passage 2
    vecs = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    tok_off = np.array([0, 3, 4, 8])
    v, off = mvl.per_passage_tokens(vecs, tok_off, np.array([0, 2, 3]), 2)
    assert v[:, 0].tolist() == [0, 1, 3, 4, 5]  # passage 0: its first 2; passage 1: its only one; passage 2: first 2
    assert off.tolist() == [0, 3, 5]
    v, off = mvl.per_passage_tokens(vecs, tok_off, np.array([0, 1, 2, 3]), 1)  # one document per passage, m=1
    assert v[:, 0].tolist() == [0, 3, 4] and off.tolist() == [0, 1, 2, 3]


def test_per_passage_search_scores_a_document_by_its_best_passage(mvl):
    # the best vector sits in document 0's second passage: per passage finds it, truncation (first passage) does not
    vecs = np.array([[0, 1], [0, 1], [1, 0], [0, 1]], dtype=np.float32)
    v, off = mvl.per_passage_tokens(vecs, np.array([0, 2, 3, 4]), np.array([0, 2, 3]), 8)
    run, p50 = mvl.dense_run(["q"], np.array([[1, 0]], np.float32), ["d0", "d1"], v, off)
    assert list(run["q"]) == ["d0", "d1"] and run["q"]["d0"] == pytest.approx(1.0) and p50 >= 0
    v, off = mvl.per_passage_tokens(vecs, np.array([0, 2, 3, 4]), np.array([0, 1, 2]), 8)  # passage 1 is not d0's
    run, _ = mvl.dense_run(["q"], np.array([[1, 0]], np.float32), ["d0", "d1"], v, off)
    assert run["q"]["d0"] == pytest.approx(0.0) and run["q"]["d1"] == pytest.approx(1.0)


def test_plot_writes_a_png(mvl, tmp_path):
    rows = [{"system": s, "setting": "truncation", "model": model, "ndcg@10": 0.5 + i / 10, "bytes/doc": 1536 * (i + 1)}
            for i, (s, model) in enumerate([("BM25", "-"), ("single vector", "single"),
                                            ("single vector + BM25", "single"),
                                            ("ME-BERT m=4", "mebert8 (evaluated at m=4)")])]
    mvl.plot(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
