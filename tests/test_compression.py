"""Compressed vectors in stored indexes (issue #33): fp16 / int8 / binary storage and ``--dim`` cuts, checked
against numpy references (int8 codes and scores, exact Hamming ranking, rescored scores), sentence-transformers'
``quantize_embeddings`` for the sign bits, int8 calibration kept across ``index add``/``remove``, and bad
values refused before any encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from twotower.retrieval.store import IndexSpec, IndexStore, IndexStoreError, NewDocs


def _unit(n: int, d: int, seed: int, scale: float = 1.0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True) * scale).astype(np.float32)


def _docs(vectors: np.ndarray, start: int = 0) -> NewDocs:
    n = len(vectors)
    return NewDocs([f"d{i}" for i in range(start, start + n)], ["t"] * n, ["x"] * n, vectors)


def _np_codes(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """int8 (8-bit scalar) codes in float64: floor(255 · clip((x − min) / (max − min), 0, 1))."""
    rel = np.clip((x.astype(np.float64) - lo) / (hi.astype(np.float64) - lo), 0, 1)
    return np.minimum(np.floor(rel * 255), 255).astype(np.int64)


def _np_decode(codes: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.float64) + (codes.astype(np.float64) + 0.5) / 255 * (hi.astype(np.float64) - lo)


def _hamming(q_bits: np.ndarray, d_bits: np.ndarray) -> np.ndarray:
    """(nq, nd) Hamming distances between packed bit rows, from unpacked bits."""
    qa, da = np.unpackbits(q_bits, axis=1).astype(np.int64), np.unpackbits(d_bits, axis=1).astype(np.int64)
    return (qa[:, None, :] != da[None, :, :]).sum(axis=2)


def test_int8_codes_calibration_and_scores_match_numpy(tmp_path):
    x, q = _unit(400, 32, 0), _unit(7, 32, 1)
    store = IndexStore.build(tmp_path / "i8", _docs(x), model={"name": "m"}, spec=IndexSpec(vectors="int8"),
                             show_progress=False)
    assert store.manifest["vectors"]["type"] == "int8" and store.manifest["factory"] == "SQ8"
    lo, hi = x.min(axis=0), x.max(axis=0)
    np.testing.assert_array_equal(np.load(store.dir / "calibration.npy"), np.stack([lo, hi]))
    codes = np.asarray(store.vectors).astype(np.int64)
    assert store.vectors.dtype == np.uint8 and codes.shape == (400, 32)
    ref = _np_codes(x, lo, hi)
    assert np.abs(codes - ref).max() <= 1 and (codes == ref).mean() > 0.999  # float32 vs float64 at code edges
    scores, rows = store.search(q, 10)
    decoded = _np_decode(codes, lo, hi)
    full = q.astype(np.float64) @ decoded.T
    for i in range(len(q)):
        np.testing.assert_allclose(scores[i], full[i, rows[i]], rtol=0, atol=2e-5)
        np.testing.assert_allclose(scores[i], np.sort(full[i])[::-1][:10], rtol=0, atol=2e-5)
    # int8 keeps the fp32 ranking nearly intact: the best document of each query is the same
    assert (rows[:, 0] == np.argmax(q @ x.T, axis=1)).all()


def test_binary_bits_match_sentence_transformers_and_hamming_ranking_is_exact(tmp_path):
    from sentence_transformers.util.quantization import quantize_embeddings

    x, q = _unit(300, 64, 2), _unit(6, 64, 3)
    store = IndexStore.build(tmp_path / "b", _docs(x), model={"name": "m"},
                             spec=IndexSpec(vectors="binary", rescore="none"), show_progress=False)
    bits = np.asarray(store.vectors)
    np.testing.assert_array_equal(bits, quantize_embeddings(x, precision="ubinary"))
    k = 15
    scores, rows = store.search(q, k)
    ham = _hamming(quantize_embeddings(q, precision="ubinary"), bits)
    for i in range(len(q)):
        got = ham[i, rows[i]]
        np.testing.assert_array_equal(got, np.sort(ham[i])[:k])  # the k smallest distances, in order
        np.testing.assert_allclose(scores[i], 1 - 2 * got / 64, atol=1e-6)
    assert store.manifest["vectors"]["rescore"] == "none"


@pytest.mark.parametrize("rescore", ["int8", "fp32"])
def test_binary_rescoring_matches_numpy(tmp_path, rescore):
    x, q = _unit(500, 64, 4), _unit(8, 64, 5)
    k, factor = 5, 4
    store = IndexStore.build(tmp_path / rescore, _docs(x), model={"name": "m"},
                             spec=IndexSpec(vectors="binary", rescore=rescore, rescore_factor=factor),
                             show_progress=False)
    lo, hi = x.min(axis=0), x.max(axis=0)
    docs = _np_decode(np.asarray(store.vectors), lo, hi) if rescore == "int8" else x.astype(np.float64)
    if rescore == "fp32":
        np.testing.assert_array_equal(np.asarray(store.vectors), x)
    ham = _hamming(np.packbits(q > 0, axis=1), np.packbits(x > 0, axis=1))
    exact = q.astype(np.float64) @ docs.T
    scores, rows = store.search(q, k)
    for i in range(len(q)):
        np.testing.assert_allclose(scores[i], exact[i, rows[i]], atol=2e-5)  # rescored with the float query
        assert list(scores[i]) == sorted(scores[i], reverse=True)
        cutoff = np.sort(ham[i])[k * factor - 1]
        assert (ham[i, rows[i]] <= cutoff).all()  # every hit was a Hamming candidate
        sure = np.flatnonzero(ham[i] < cutoff)  # certainly candidates: must be in the hits if they score higher
        better = sure[exact[i, sure] > scores[i, -1] + 1e-5]
        assert set(better) <= set(rows[i].tolist())
    # a factor that makes every document a candidate: exactly the numpy rescored top k
    scores, rows = store.search(q, k, rescore_factor=100)
    np.testing.assert_array_equal(rows, np.argsort(-exact, axis=1, kind="stable")[:, :k])
    with pytest.raises(IndexStoreError, match="rescore factor 0"):
        store.search(q, k, rescore_factor=0)


def test_int8_calibration_survives_add_and_remove(tmp_path):
    x = _unit(200, 16, 6)
    store = IndexStore.build(tmp_path / "c", _docs(x), model={"name": "m"}, spec=IndexSpec(vectors="int8"),
                             show_progress=False)
    calibration = np.load(store.dir / "calibration.npy")
    old_codes = np.asarray(store.vectors).copy()
    wide = _unit(20, 16, 7, scale=3.0)  # far outside the first corpus's ranges: a recomputation would show
    grown = store.add(_docs(wide, start=1000), show_progress=False)
    np.testing.assert_array_equal(np.load(grown.dir / "calibration.npy"), calibration)
    np.testing.assert_array_equal(np.asarray(grown.vectors)[:200], old_codes)  # old codes unchanged
    new_codes = np.asarray(grown.vectors)[200:].astype(np.int64)
    ref = _np_codes(wide, calibration[0], calibration[1])  # clipped into the old ranges
    assert np.abs(new_codes - ref).max() <= 1 and (new_codes == ref).mean() > 0.99
    assert {0, 255} <= set(np.unique(new_codes).tolist())
    shrunk = grown.remove(["d0", "d1000"], show_progress=False)  # a rebuild of the FAISS index from the codes
    np.testing.assert_array_equal(np.load(shrunk.dir / "calibration.npy"), calibration)
    np.testing.assert_array_equal(np.asarray(shrunk.vectors), np.delete(np.asarray(grown.vectors), [0, 200], axis=0))
    q = _unit(4, 16, 8)
    s1, r1 = shrunk.search(q, 5)
    decoded = _np_decode(np.asarray(shrunk.vectors), calibration[0], calibration[1])
    np.testing.assert_allclose(s1, np.sort(q @ decoded.T, axis=1)[:, ::-1][:, :5], atol=2e-5)


@pytest.mark.parametrize("vectors", ["fp32", "fp16", "binary"])
def test_dim_cuts_documents_and_queries(tmp_path, vectors):
    x, q = _unit(150, 48, 9), _unit(5, 48, 10)
    spec = IndexSpec(vectors=vectors, dim=16, rescore="fp32" if vectors == "binary" else None)
    store = IndexStore.build(tmp_path / vectors, _docs(x), model={"name": "m"}, spec=spec, show_progress=False)
    cut = x[:, :16] / np.linalg.norm(x[:, :16], axis=1, keepdims=True)
    qc = q[:, :16] / np.linalg.norm(q[:, :16], axis=1, keepdims=True)
    assert store.dim == 16 and store.manifest["vectors"]["source_dim"] == 48
    np.testing.assert_allclose(store.float_vectors(np.arange(150)), cut, atol=1e-3 if vectors == "fp16" else 1e-6)
    scores, rows = store.search(q, 5, rescore_factor=1000)  # full-size queries, cut like the documents
    exact = qc @ cut.T
    np.testing.assert_array_equal(rows, np.argsort(-exact, axis=1)[:, :5])
    np.testing.assert_allclose(scores, np.sort(exact, axis=1)[:, ::-1][:, :5], atol=2e-3)
    grown = IndexStore.open(store.root).add(_docs(_unit(3, 48, 11), start=500), show_progress=False)
    assert grown.dim == 16 and len(grown) == 153 and grown.manifest["vectors"] == store.manifest["vectors"]


@pytest.mark.parametrize("options, message", [
    (["--dim", "64"], "--dim 64 is more than the model's 32 dimensions"),
    (["--vectors", "binary", "--rescore-factor", "0"], "--rescore-factor 0: a whole number at least 1"),
    (["--vectors", "binary", "--dim", "12"], "--vectors binary needs a dimension that is a multiple of 8"),
    (["--vectors", "int4"], "--vectors int4: choose one of fp32, fp16, int8, binary"),
    (["--vectors", "int8", "--rescore", "fp32"], "--rescore applies to --vectors binary"),
    (["--vectors", "int8", "--kind", "ivfpq"], "--vectors int8 applies to --kind flat, hnsw or ivf"),
    (["--vectors", "binary", "--kind", "ivf"], "--vectors binary builds a FAISS binary index of --kind flat or hnsw"),
])
def test_bad_values_stop_before_encoding(tiny_beir, tiny_bert_dir, tmp_path, monkeypatch, options, message):
    from typer.testing import CliRunner

    import twotower.retrieval.indexing as indexing
    from twotower.cli import app

    def no_encoding(*args, **kwargs):
        raise AssertionError("documents were encoded before the options were checked")

    monkeypatch.setattr(indexing, "encode_new_docs", no_encoding)
    out = tmp_path / "bad"
    res = CliRunner().invoke(app, ["index", "build", "--data", str(tiny_beir), "--model", str(tiny_bert_dir),
                                   "--out", str(out), "--no-progress", *options])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output and not out.exists()


def test_cli_binary_index_build_add_search_eval(tiny_beir, tiny_bert_dir, tmp_path):
    """The manifest's settings reach ``index add``, ``search`` and ``eval --index``; the rescored scores are the
    float query against the int8 documents."""
    from typer.testing import CliRunner

    from twotower.cli import app
    from twotower.retrieval.searcher import Searcher

    runner = CliRunner()
    out = tmp_path / "bidx"
    res = runner.invoke(app, ["index", "build", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--out",
                              str(out), "--vectors", "binary", "--dim", "24", "--rescore-factor", "2",
                              "--precision", "fp32", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "6 vectors of 24 dims (cut from 32) binary, rescored against int8 × 2, BFlat" in " ".join(res.output.split())
    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps({"_id": "d9", "title": "Kombucha", "text": "Kombucha is fermented tea."}) + "\n")
    res = runner.invoke(app, ["index", "add", "--index", str(out), "--docs", str(new), "--no-progress"])
    assert res.exit_code == 0 and "7 documents" in res.output, res.output
    store = IndexStore.open(out)
    assert store.manifest["vectors"] == {"type": "binary", "dim": 24, "source_dim": 32, "stored": "int8",
                                         "rescore": "int8", "rescore_factor": 2}
    res = runner.invoke(app, ["search", "--index", str(out), "fermented tea", "-k", "3", "--json", "--mode", "dense"])
    assert res.exit_code == 0, res.output
    hits = [json.loads(line) for line in res.output.splitlines()]
    q = Searcher(out, query_runtime="auto").encode_queries(["fermented tea"])[:, :24]  # as the command encodes it
    q /= np.linalg.norm(q)
    docs = store.float_vectors(np.arange(len(store)))
    for h in hits:
        assert h["score"] == pytest.approx(float(docs[store.row_of[h["id"]]] @ q[0]), abs=1e-5)
    runner.invoke(app, ["index", "remove", "--index", str(out), "d9"])
    res = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--retriever", "dense", "--index", str(out), "--out", str(tmp_path / "e.json"),
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "e.json").read_text())["num_queries"] == 3


def test_int8_ivf_probing_every_list_equals_numpy_and_binary_hnsw_takes_ef_search(tmp_path):
    x, q = _unit(400, 16, 12), _unit(5, 16, 13)
    ivf = IndexStore.build(tmp_path / "ivf", _docs(x), model={"name": "m"},
                           spec=IndexSpec(kind="ivf", nlist=4, vectors="int8"), show_progress=False)
    assert ivf.manifest["factory"] == "IVF4,SQ8"
    lo, hi = np.load(ivf.dir / "calibration.npy")
    decoded = _np_decode(np.asarray(ivf.vectors), lo, hi)
    scores, rows = ivf.search(q, 5, nprobe=4)
    np.testing.assert_allclose(scores, np.sort(q @ decoded.T, axis=1)[:, ::-1][:, :5], atol=2e-5)
    hnsw = IndexStore.build(tmp_path / "bh", _docs(x), model={"name": "m"},
                            spec=IndexSpec(kind="hnsw", hnsw_m=8, vectors="binary", rescore="fp32"),
                            show_progress=False)
    assert hnsw.manifest["factory"] == "BHNSW8"
    scores, rows = hnsw.search(q, 3, ef_search=400, rescore_factor=100)  # every document a candidate
    np.testing.assert_array_equal(rows, np.argsort(-(q @ x.T), axis=1)[:, :3])
    with pytest.raises(IndexStoreError, match="nprobe applies to IVF indexes"):
        hnsw.search(q, 3, nprobe=2)
