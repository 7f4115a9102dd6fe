"""The CPU runtimes (encoders/runtimes*.py): each runtime's vectors against torch's on real text (the installed
all-MiniLM-L6-v2 on SciFact documents), the fallback when a runtime's package is missing or its graph fails the
check, the on-disk graph cache (reuse, invalidation, pruning), and runtime= / --runtime through the API and CLI.

Tolerances (smallest cosine between a runtime's vector and torch fp32's, per text): ONNX Runtime fp32 and OpenVINO
fp32 ≥ 0.99999 and max |Δ| ≤ 1e-4 (the same arithmetic reordered); OpenVINO bf16 ≥ 0.999 (bf16 has 8 mantissa bits);
ONNX Runtime int8 ≥ 0.98 (runtimes_tower.MIN_COSINE["int8"], what the int8 check enforces)."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from twotower.encoders import runtimes, runtimes_graph, runtimes_tower  # noqa: E402
from twotower.encoders.inference import cpu_has_fast_bf16, encode_texts  # noqa: E402
from twotower.encoders.towers import DualEncoder  # noqa: E402
from twotower.errors import TwoTowerError  # noqa: E402

N_DOCS = 24


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("tt_home")
        mp.setenv("TWOTOWER_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def minilm(home):
    from twotower.encoders.backbone import default_model_path

    if not default_model_path().exists():
        pytest.skip(f"the bundled all-MiniLM-L6-v2 is not installed at {default_model_path()}")
    return DualEncoder.load(doc_max_length=256).doc_tower


@pytest.fixture(scope="module")
def docs(scifact):
    with open(scifact / "corpus.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(N_DOCS)]
    return [f"{r['title']} {r['text']}".strip() for r in rows]


@pytest.fixture(scope="module")
def reference(minilm, docs):
    return encode_texts(minilm, docs, precision="fp32", show_progress=False)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _set_amx(monkeypatch, present: bool) -> None:
    """AMX or not, as auto's choice (runtimes) and a graph's float precision and batch size (runtimes_tower) see it."""
    for module in (runtimes, runtimes_tower):
        monkeypatch.setattr(module, "has_amx", lambda: present)


def test_onnx_fp32_matches_torch_on_real_text(minilm, docs, reference):
    graph = runtimes.graph_for(minilm, "onnx", "auto")
    assert graph.precision == "fp32" and graph.min_cosine >= 0.99999
    for batch_size in (1, 7, 32):  # padded batches of mixed lengths, and none
        got = graph.encode(docs, batch_size=batch_size)
        assert got.shape == reference.shape and got.dtype == np.float32
        assert _cosines(got, reference).min() >= 0.99999
        assert np.abs(got - reference).max() <= 1e-4
    assert runtimes.last_choice(minilm)["runtime"] == "onnx"
    assert graph.encode([]).shape == (0, minilm.dim)


def test_openvino_fp32_and_bf16_match_torch_on_real_text(minilm, docs, reference):
    pytest.importorskip("openvino")
    fp32 = runtimes.graph_for(minilm, "openvino", "fp32")
    got = fp32.encode(docs)
    assert fp32.precision == "fp32"
    assert _cosines(got, reference).min() >= 0.99999 and np.abs(got - reference).max() <= 1e-4
    # a corpus of many batches runs on the throughput model's streams, batches in flight out of order: each row's
    # vector still lands in its own place
    assert fp32.session._throughput is None and len(docs) >= runtimes_tower.MANY_BATCHES * 3
    streamed = fp32.encode(docs, batch_size=3)
    assert fp32.session._throughput is not None
    assert np.abs(streamed - reference).max() <= 1e-4
    bf16 = runtimes.graph_for(minilm, "openvino", "bf16")
    got16 = bf16.encode(docs)
    cos = _cosines(got16, reference)
    assert cos.min() >= 0.999
    if cpu_has_fast_bf16():  # bf16 really ran: not bit-for-bit the fp32 vectors
        assert np.abs(got16 - reference).max() > 1e-5
    # auto precision = bf16 exactly where the CPU has fast bf16 (as torch decides)
    assert runtimes.graph_for(minilm, "openvino", "auto").precision == ("bf16" if cpu_has_fast_bf16() else "fp32")


def test_int8_is_quantized_close_and_checked_on_the_texts(minilm, docs, reference, caplog):
    import onnx

    graph = runtimes.graph_for(minilm, "onnx-int8")
    ops = {n.op_type for n in onnx.load(str(graph.graph)).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "QAttention"}  # int8 matmuls
    # the MatMul weights (42 of the 90 MB) in one byte each; the 47 MB embedding table stays fp32
    assert graph.graph.stat().st_size < 0.7 * runtimes_graph.onnx_graph(minilm).stat().st_size
    with caplog.at_level(logging.INFO, logger="twotower.encoders.runtimes_tower"):
        got = graph.encode(docs)
    assert "int8 check on the texts" in caplog.text
    cos = _cosines(got, reference)
    assert cos.min() >= runtimes_tower.MIN_COSINE["int8"]
    assert cos.min() < 0.99999  # quantized: close, not equal
    with pytest.raises(TwoTowerError, match="int8; precision 'bf16'"):
        runtimes.graph_for(minilm, "onnx-int8", "bf16")


def test_cache_reused_and_invalidated(tiny_bert_dir, home, monkeypatch):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    first = runtimes_graph.onnx_graph(tower)
    assert first.is_file() and first.parent.parent == home / "graphs"
    from twotower.encoders import onnx_runtime

    def no_export(*a, **k):
        raise AssertionError("exported again")

    with monkeypatch.context() as mp:  # same weights: the cached graph, no export
        mp.setattr(onnx_runtime, "export_tower", no_export)
        assert runtimes_graph.onnx_graph(tower) == first
        assert runtimes_graph.onnx_graph(DualEncoder.build(tiny_bert_dir).query_tower) == first  # another load
    import torch

    with torch.no_grad():
        next(tower.parameters()).add_(0.01)  # an optimizer step: new weights, new key, new graph
    second = runtimes_graph.onnx_graph(tower)
    assert second != first and second.is_file()
    # a different onnx version is a different key too
    monkeypatch.setattr(sys.modules["onnx"], "__version__", "0.0-test")
    assert runtimes_graph.graph_key(tower) != second.parent.name
    assert not list(second.parent.glob("*.tmp"))  # atomic writes leave no temporary files


def test_cache_keeps_the_most_recent(tiny_bert_dir, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path))
    monkeypatch.setattr(runtimes_graph, "KEEP_GRAPHS", 2)
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    paths = []
    for _ in range(3):
        paths.append(runtimes_graph.onnx_graph(tower))
        with torch.no_grad():
            next(tower.parameters()).add_(0.01)
    assert [p.is_file() for p in paths] == [False, True, True]


def test_missing_runtime_explicit_fails_auto_falls_back(tiny_bert_dir, home, monkeypatch, caplog):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(TwoTowerError, match=r"runtime 'openvino' needs openvino.*pip install 'twotower\[cpu\]'.*"
                                            "runtime 'torch'"):
        runtimes.graph_for(tower, "openvino", "fp32")
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.runtimes"):
        graph = runtimes.graph_for(tower, "auto", "fp32", n_texts=5)
    assert graph.runtime == "onnx"  # the next in AUTO_ORDER["fp32"]
    assert "not openvino" in caplog.text and "needs openvino" in caplog.text
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    runtimes_tower._SESSIONS.clear()
    assert runtimes.graph_for(tower, "auto", "fp32", n_texts=5) is None  # torch, saying why
    assert runtimes.last_choice(tower) == {"runtime": "torch", "precision": "fp32",
                                           "reason": "auto: openvino unavailable, onnx unavailable"}
    texts = ["a", "b c d"]
    np.testing.assert_array_equal(  # and encodes exactly as torch does
        runtimes.encode_with_runtime(tower, texts, runtime="auto", precision="fp32", show_progress=False),
        encode_texts(tower, texts, precision="fp32", show_progress=False))


def test_a_graph_that_fails_its_check_is_refused(tiny_bert_dir, tmp_path, monkeypatch, caplog):
    import torch

    monkeypatch.setenv("TWOTOWER_HOME", str(tmp_path))  # its own cache: the graph it spoils is used by no other test

    tower = DualEncoder.build(tiny_bert_dir).query_tower
    path = runtimes_graph.onnx_graph(tower)
    other = DualEncoder.build(tiny_bert_dir).query_tower
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std().nan_to_num(0.1))
    path.write_bytes(runtimes_graph.onnx_graph(other).read_bytes())  # a stale / wrong graph under tower's key
    runtimes_tower._SESSIONS.clear()
    with pytest.raises(TwoTowerError, match=r"runtime 'onnx' \(fp32\) differs from torch on probe texts: smallest "
                                            r"cosine .* < 0.999 \(graph .*\.onnx\) \(or use runtime 'torch'\)"):
        runtimes.graph_for(tower, "onnx")
    monkeypatch.setattr(runtimes, "AUTO_ORDER", {"fp32": ("onnx", "torch"), "bf16": ("onnx", "torch")})
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.runtimes"):
        assert runtimes.graph_for(tower, "auto", "fp32", n_texts=10) is None
    assert "not onnx" in caplog.text and "differs from torch" in caplog.text


def test_auto_choices(tiny_bert_dir, home, monkeypatch):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    assert runtimes.graph_for(tower, "auto", "fp32", n_texts=10) is None  # few texts: torch
    assert "not worth an export" in runtimes.last_choice(tower)["reason"]
    assert runtimes.graph_for(tower, "auto", "fp32", n_texts=5000, compile=True) is None
    assert runtimes.last_choice(tower)["reason"] == "auto: compile asks for torch"
    with pytest.raises(TwoTowerError, match="runtime 'onnx' runs fp32"):
        runtimes.graph_for(tower, "onnx", "bf16")
    with pytest.raises(TwoTowerError, match="compile applies to the torch runtime"):
        runtimes.graph_for(tower, "onnx", compile=True)
    with pytest.raises(TwoTowerError, match="runtime 'tensorrt': choose one of auto, torch, onnx, openvino"):
        runtimes.graph_for(tower, "tensorrt")
    with runtimes.using_runtime("torch") as used:
        runtimes.encode_with_runtime(tower, ["x"] * 3, show_progress=False, desc="encoding documents")
    assert used["documents"]["runtime"] == "torch" and runtimes.current_runtime() == "auto"


def test_api_and_cli_runtime(tiny_bert_dir, tiny_beir, home, tmp_path, caplog):
    import twotower as tt
    from typer.testing import CliRunner

    from twotower.cli import app

    texts = ["green tea is steamed", {"title": "Coffee", "text": "is roasted"}]
    onnx = tt.Encoder.load(tiny_bert_dir, device="cpu", runtime="onnx").encode_documents(texts)
    torch_ = tt.Encoder.load(tiny_bert_dir, device="cpu", runtime="torch", precision="fp32").encode_documents(texts)
    np.testing.assert_allclose(onnx, torch_, atol=1e-4)
    with pytest.raises(TwoTowerError, match="runtime 'gpu'"):
        tt.Encoder.load(tiny_bert_dir, device="cpu", runtime="gpu")
    result = tt.evaluate(str(tiny_bert_dir), tiny_beir, metrics=["ndcg@10"], runtime="onnx")
    assert result.to_json()["runtime"]["documents"]["runtime"] == "onnx"
    runner = CliRunner()
    out = runner.invoke(app, ["index", "build", "--data", str(tiny_beir), "--out", str(tmp_path / "idx"), "--model",
                              str(tiny_bert_dir), "--runtime", "onnx", "--no-progress"])
    assert out.exit_code == 0, out.output
    bad = runner.invoke(app, ["eval", "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--runtime", "tvm"])
    assert bad.exit_code != 0 and "runtime 'tvm': choose one of" in bad.output
    with caplog.at_level(logging.INFO, logger="twotower.encoders.runtimes"):
        out = runner.invoke(app, ["mine", "--data", str(tiny_beir), "--split", "test", "--out", str(tmp_path / "m.jsonl"),
                                  "--retriever", "model", "--model", str(tiny_bert_dir), "--runtime", "onnx",
                                  "--rank-from", "1", "--num-negatives", "1", "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "encoding with onnx" in caplog.text  # mine's corpus went through the runtime asked for
    bad = runner.invoke(app, ["mine", "--data", str(tiny_beir), "--out", str(tmp_path / "m2.jsonl"), "--runtime", "x"])
    assert bad.exit_code == 2 and "runtime 'x'" in bad.output and not (tmp_path / "m2.jsonl").exists()


def test_auto_precision_follows_the_measured_bf16_rate(tiny_bert_dir, home, monkeypatch):
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: False)  # bf16 instructions, but no faster than fp32
    _set_amx(monkeypatch, False)  # the same choices on every CPU this test runs on
    graph = runtimes.graph_for(tower, "auto", "auto", n_texts=5)
    assert graph is not None and graph.precision == "fp32" and graph.runtime in runtimes.AUTO_ORDER["fp32"]
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: True)
    monkeypatch.setattr(runtimes, "AUTO_ORDER", {"bf16": ("torch",), "fp32": ("onnx", "torch")})
    assert runtimes.graph_for(tower, "auto", "auto", n_texts=5) is None
    assert runtimes.last_choice(tower)["precision"] == "bf16"
    # a handful of texts (torch, no export) follows the same measurement, not the CPU's flags
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1000)
    assert runtimes.graph_for(tower, "auto", "auto", n_texts=5) is None
    assert runtimes.last_choice(tower)["precision"] == "bf16"
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: False)
    assert runtimes.graph_for(tower, "auto", "auto", n_texts=5) is None
    assert runtimes.last_choice(tower)["precision"] == "fp32"
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: True)
    # and torch then encodes in bf16, as asked: the same vectors as encode_texts' bf16 path
    texts = ["green tea", "a longer text about coffee and tea"]
    np.testing.assert_array_equal(
        runtimes.encode_with_runtime(tower, texts, runtime="auto", show_progress=False),
        encode_texts(tower, texts, precision="bf16", show_progress=False))


def test_calibration_sample_spreads_over_the_texts():
    from twotower.encoders import runtimes_int8

    texts = [f"t{i}" for i in range(10)]
    assert runtimes_int8.calibration_sample(texts, 4) == ["t0", "t3", "t6", "t9"]  # linspace(0, 9, 4), rounded
    assert runtimes_int8.calibration_sample(texts[:3], 8) == ["t0", "t1", "t2"]
    assert runtimes_int8.sample_hash(["a", "b"], 256) != runtimes_int8.sample_hash(["ab"], 256)
    assert runtimes_int8.sample_hash(["a"], 256) != runtimes_int8.sample_hash(["a"], 128)
    with pytest.raises(TwoTowerError, match="needs texts"):
        runtimes_int8.calibration_sample([])


@pytest.fixture()
def small_calibration(monkeypatch):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    from twotower.encoders import runtimes_int8

    monkeypatch.setattr(runtimes_int8, "CALIBRATION_TEXTS", 96)  # NNCF on 96 texts: seconds, not a minute
    return runtimes_int8


@pytest.fixture(scope="module")
def corpus(scifact):
    """96 SciFact documents: the texts int8 calibrates on (the first 24 are ``docs``)."""
    with open(scifact / "corpus.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(96)]
    return [f"{r['title']} {r['text']}".strip() for r in rows]


def test_openvino_int8_is_static_int8_close_and_calibrated_on_the_texts(minilm, docs, corpus, reference,
                                                                        small_calibration):
    import openvino as ov

    graph = runtimes.graph_for(minilm, "openvino-int8", texts=corpus, max_length=256)
    model = ov.Core().read_model(str(graph.graph))
    assert any(op.get_type_name() == "FakeQuantize" for op in model.get_ops())  # activations quantized statically
    assert any(op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.i8 for op in model.get_ops())
    got = graph.encode(docs)
    cos = _cosines(got, reference)
    assert cos.min() >= runtimes_tower.MIN_COSINE["int8"] and cos.min() < 0.99999  # quantized: close, not equal
    assert graph.sample_min_cosine >= runtimes_tower.MIN_COSINE["int8"]  # its own check on 64 of the corpus
    # the same texts find their graph again; other texts are calibrated anew
    assert small_calibration.openvino_int8_graph(minilm, corpus, 256) == graph.graph
    other = small_calibration.openvino_int8_graph(minilm, corpus[:48], 256)
    assert other != graph.graph and other.is_file() and other.with_suffix(".bin").is_file()
    assert not list(graph.graph.parent.glob(".int8.*"))  # no half-written pair left behind
    with pytest.raises(TwoTowerError, match="calibrates on the texts it encodes"):
        runtimes.graph_for(minilm, "openvino-int8")
    with pytest.raises(TwoTowerError, match="'openvino-int8' is int8; precision 'fp32'"):
        runtimes.graph_for(minilm, "openvino-int8", "fp32", texts=docs)


def test_auto_takes_int8_only_where_it_keeps_the_bar(minilm, corpus, small_calibration, monkeypatch, caplog):
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: False)
    _set_amx(monkeypatch, False)
    monkeypatch.setattr(runtimes_graph, "_isa", lambda: "vnni")
    graph = runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256)
    choice = runtimes.last_choice(minilm)
    assert graph.runtime == "openvino-int8" and choice["runtime"] == "openvino-int8"
    assert choice["min_cosine_on_texts"] >= runtimes.AUTO_INT8_MIN_COSINE
    # a pinned precision is kept: no int8
    assert runtimes.graph_for(minilm, "auto", "fp32", texts=corpus, max_length=256).precision == "fp32"
    # a bar the graph cannot keep on these texts: fp32, saying why
    monkeypatch.setattr(runtimes, "AUTO_INT8_MIN_COSINE", 0.99999)
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.runtimes"):
        graph = runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256)
    assert graph.precision == "fp32" and "not openvino-int8" in caplog.text and "differs from torch on 64 of the "\
        "texts" in caplog.text
    assert "openvino-int8 did not pass" in runtimes.last_choice(minilm)["reason"]
    small_calibration.refusal_path(minilm).unlink()  # remembered (see below): forgotten for the next checks
    # no 8-bit dot products: not even tried
    monkeypatch.setattr(runtimes, "AUTO_INT8_MIN_COSINE", 0.99)
    monkeypatch.setattr(runtimes_graph, "_isa", lambda: "avx2")
    assert runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256).precision == "fp32"
    assert "int8" not in runtimes.last_choice(minilm)["reason"]  # not tried, so not said to have failed
    # nncf missing: an explicit openvino-int8 names it, auto goes on in fp32
    monkeypatch.setitem(sys.modules, "nncf", None)
    runtimes_tower._SESSIONS.clear()
    with pytest.raises(TwoTowerError, match=r"runtime 'openvino-int8' needs nncf.*twotower\[cpu\]"):
        runtimes.graph_for(minilm, "openvino-int8", texts=corpus[:5])
    monkeypatch.setattr(runtimes_graph, "_isa", lambda: "vnni")
    assert runtimes.graph_for(minilm, "auto", "auto", texts=corpus[:5]).precision == "fp32"


def test_auto_on_amx_prefers_openvino_over_torch_bf16(tiny_bert_dir, home, monkeypatch):
    """On AMX (cpu_backends_amx.md) bf16 goes to OpenVINO, not torch; elsewhere the bf16 order is torch's alone."""
    tower = DualEncoder.build(tiny_bert_dir).query_tower
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: True)
    _set_amx(monkeypatch, False)
    assert runtimes.graph_for(tower, "auto", "auto", n_texts=5) is None  # AVX512-BF16 without AMX: torch bf16
    assert runtimes.last_choice(tower)["precision"] == "bf16"
    _set_amx(monkeypatch, True)
    graph = runtimes.graph_for(tower, "auto", "auto", n_texts=5)
    assert (graph.runtime, graph.precision) == ("openvino", "bf16") and "AMX" in runtimes.last_choice(tower)["reason"]
    texts = ["green tea", "a longer text about coffee and tea, " * 20]
    got = runtimes.encode_with_runtime(tower, texts, runtime="auto", show_progress=False)
    assert _cosines(got, encode_texts(tower, texts, precision="fp32", show_progress=False)).min() > 0.999


def test_auto_int8_on_amx_and_a_refusal_is_remembered(minilm, corpus, small_calibration, monkeypatch, caplog):
    monkeypatch.setattr(runtimes, "AUTO_MIN_TEXTS", 1)
    monkeypatch.setattr(runtimes, "bf16_pays", lambda: True)  # bf16 pays: without AMX int8 is not tried
    _set_amx(monkeypatch, True)
    monkeypatch.setattr(runtimes_graph, "_isa", lambda: "vnni")
    monkeypatch.setattr(runtimes_graph, "cpu_kind", lambda: "amx")
    runtimes_tower._SESSIONS.clear()
    graph = runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256)
    choice = runtimes.last_choice(minilm)
    assert graph.runtime == "openvino-int8" and choice["float_precision"] == "bf16" and "AMX" in choice["reason"]
    assert choice["min_cosine_on_texts"] >= runtimes.AUTO_INT8_MIN_COSINE
    calls = []
    real = small_calibration.openvino_int8_graph
    monkeypatch.setattr(small_calibration, "openvino_int8_graph", lambda *a, **k: calls.append(1) or real(*a, **k))
    # a bar int8 cannot keep: refused, remembered for this model on this CPU kind, OpenVINO bf16 instead
    monkeypatch.setattr(runtimes, "AUTO_INT8_MIN_COSINE", 0.99999)
    runtimes_tower._SESSIONS.clear()
    with caplog.at_level(logging.INFO):
        graph = runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256)
    assert (graph.runtime, graph.precision) == ("openvino", "bf16") and len(calls) == 1
    saved = small_calibration.refusal_path(minilm)
    assert "differs from torch on 64 of the texts" in json.loads(saved.read_text())["reason"]
    assert "remembered in" in caplog.text
    # the next encoding (another process: no session cached) does not calibrate again
    runtimes_tower._SESSIONS.clear()
    graph = runtimes.graph_for(minilm, "auto", "auto", texts=corpus[:90], max_length=256)
    assert graph.runtime == "openvino" and len(calls) == 1
    assert "refused before for this model" in runtimes.last_choice(minilm)["reason"]
    # an explicit openvino-int8 is still had (its own bar), and another CPU kind tries again
    assert runtimes.graph_for(minilm, "openvino-int8", texts=corpus, max_length=256).runtime == "openvino-int8"
    monkeypatch.setattr(runtimes_graph, "cpu_kind", lambda: "vnni")
    monkeypatch.setattr(runtimes, "AUTO_INT8_MIN_COSINE", 0.99)
    runtimes_tower._SESSIONS.clear()
    assert runtimes.graph_for(minilm, "auto", "auto", texts=corpus, max_length=256).runtime == "openvino-int8"
    saved.unlink()
