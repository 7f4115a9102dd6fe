"""The ONNX Runtime query tower: same embeddings as torch for BERT and T5 towers (every pooling, with a
projection), its fidelity check, the runtime choice and its errors, and the searcher and service using it."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from conftest import TINY_CORPUS, TINY_QRELS, TINY_QUERIES, write_beir  # noqa: E402

from twotower.encoders import onnx_runtime  # noqa: E402
from twotower.encoders.inference import encode_texts  # noqa: E402
from twotower.encoders.onnx_runtime import OnnxTower, query_runtime  # noqa: E402
from twotower.encoders.towers import DualEncoder  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402

TEXTS = ["a", "what causes the common cold?", "one two three " * 30, "vitamin d and bone density in adults", ""]


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_same_embeddings_as_torch_bert(tiny_bert_dir, pooling):
    model = DualEncoder.build(tiny_bert_dir, dim=16, pooling=pooling)
    tower = model.query_tower
    fast = OnnxTower(tower, max_length=64)
    assert fast.max_abs_diff <= onnx_runtime.TOLERANCE
    ref = encode_texts(tower, TEXTS, max_length=64, precision="fp32", show_progress=False)
    for batch_size in (1, 2, 32):  # batch 1 (a query), padded batches of mixed lengths
        got = fast.encode(TEXTS, batch_size=batch_size)
        assert got.shape == (len(TEXTS), 16) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, atol=1e-5)
    assert fast.encode([]).shape == (0, 16)


def test_same_embeddings_as_torch_t5(tiny_t5_dir):
    tower = DualEncoder.build(tiny_t5_dir).query_tower
    fast = OnnxTower(tower, max_length=64)
    ref = encode_texts(tower, TEXTS, max_length=64, precision="fp32", show_progress=False)
    np.testing.assert_allclose(fast.encode(TEXTS, batch_size=1), ref, atol=1e-5)


def test_export_leaves_a_training_tower_in_training_mode(tiny_bert_dir):
    tower = DualEncoder.build(tiny_bert_dir).query_tower.train()
    OnnxTower(tower, max_length=32)
    assert tower.training


def test_runtime_choice(tiny_bert_dir, monkeypatch, caplog):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    assert query_runtime(tower, "torch") is None
    assert isinstance(query_runtime(tower, "auto", max_length=32), OnnxTower)
    assert isinstance(query_runtime(tower, "onnx", max_length=32), OnnxTower)
    with pytest.raises(TwoTowerError, match="unknown query runtime 'tensorrt'.*auto, torch, onnx"):
        query_runtime(tower, "tensorrt")

    # a failed fidelity check: onnx refuses, auto falls back to torch and says why
    monkeypatch.setattr(onnx_runtime, "TOLERANCE", -1.0)
    with pytest.raises(TwoTowerError, match="differs from the torch tower"):
        query_runtime(tower, "onnx", max_length=32)
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.onnx_runtime"):
        assert query_runtime(tower, "auto", max_length=32) is None
    assert "queries are encoded by torch" in caplog.text and "differs" in caplog.text


def test_missing_onnxruntime_is_explained(tiny_bert_dir, monkeypatch):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    with pytest.raises(TwoTowerError, match=r"needs onnx and onnxruntime.*twotower\[serve\]"):
        query_runtime(tower, "onnx")
    assert query_runtime(tower, "auto") is None


def test_searcher_and_service_use_it(tmp_path, tiny_bert_dir):
    from fastapi.testclient import TestClient

    from twotower.retrieval.indexing import EncodeConfig, build_index
    from twotower.retrieval.searcher import Searcher
    from twotower.serve.app import create_app

    data = write_beir(tmp_path / "tiny", TINY_CORPUS, TINY_QUERIES, TINY_QRELS)
    build_index(data, tmp_path / "index", model=str(tiny_bert_dir), cfg=EncodeConfig(show_progress=False))
    queries = {q["_id"]: q["text"] for q in TINY_QUERIES}
    plain = Searcher(tmp_path / "index", precision="fp32")  # ONNX Runtime runs fp32: compare like with like
    fast = Searcher(tmp_path / "index", query_runtime="onnx")
    assert plain.onnx_queries is None and fast.onnx_queries is not None  # the export, or its cached copy
    assert isinstance(getattr(fast.onnx_queries, "tower", None), OnnxTower) or \
        type(fast.onnx_queries).__name__ == "CachedQueries"
    np.testing.assert_allclose(fast.encode_queries(list(queries.values())),
                               plain.encode_queries(list(queries.values())), atol=1e-5)
    want, got = plain.run(queries, 3), fast.run(queries, 3)
    assert {q: list(r) for q, r in got.items()} == {q: list(r) for q, r in want.items()}

    client = TestClient(create_app(tmp_path / "index", query_runtime="onnx"))
    hits = client.post("/search", json={"query": TINY_QUERIES[0]["text"], "k": 3}).json()["hits"]
    assert [h["id"] for h in hits] == list(want[TINY_QUERIES[0]["_id"]])
    with pytest.raises(TwoTowerError, match="unknown query runtime"):
        create_app(tmp_path / "index", query_runtime="fast")
