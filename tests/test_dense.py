import numpy as np
import pytest

from twotower.retrieval.dense import exact_search, to_run


def test_chunked_topk_equals_brute_force():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((37, 16)).astype(np.float32)
    d = rng.standard_normal((1000, 16)).astype(np.float32)
    scores, idx = exact_search(q, d, 25, doc_chunk=77, query_chunk=10)
    full = q @ d.T
    expected = np.argsort(-full, axis=1)[:, :25]
    assert np.array_equal(idx, expected)
    assert np.allclose(scores, np.take_along_axis(full, expected, 1), atol=1e-5)


def test_k_larger_than_corpus():
    q = np.eye(3, dtype=np.float32)
    scores, idx = exact_search(q, np.eye(3, dtype=np.float32), 10)
    assert idx.shape == (3, 3) and list(idx[:, 0]) == [0, 1, 2]
    assert to_run(["a", "b", "c"], ["x", "y", "z"], scores, idx)["b"]["y"] == 1.0


def test_dimension_mismatch():
    with pytest.raises(ValueError, match="dimension mismatch: queries have 4, documents 3"):
        exact_search(np.zeros((1, 4), np.float32), np.zeros((2, 3), np.float32), 1)
