"""Encoding through torch.compile: same vectors as eager, weights followed, failures fall back, CLI plumbing."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from twotower.cli import app
from twotower.encoders import inference
from twotower.encoders.inference import compiled_forward, encode_texts
from twotower.encoders.towers import DualEncoder

TEXTS = ["a short one", "a much longer text that has quite a few more tokens than the others do", "mid length text",
         "x", "another sentence of moderate size here", "two words", "the last text in the list, of middling length"]


def _encode(tower, compile: bool) -> np.ndarray:
    return encode_texts(tower, TEXTS, batch_size=3, precision="fp32", show_progress=False, compile=compile)


def test_compiled_equals_eager_and_follows_weight_updates(tiny_bert_dir):
    """Real Inductor compile: batches of different widths and sizes reuse one dynamic graph, give eager's
    vectors, and a later in-place weight update (a training step) shows up without recompiling by hand."""
    tower = DualEncoder.load(tiny_bert_dir).doc_tower
    assert np.allclose(_encode(tower, True), _encode(tower, False), atol=1e-5)
    assert compiled_forward(tower) is compiled_forward(tower)
    with torch.no_grad():
        tower.backbone.get_input_embeddings().weight.mul_(1.5)
    updated = _encode(tower, False)
    assert not np.allclose(updated, _encode(DualEncoder.load(tiny_bert_dir).doc_tower, False), atol=1e-3)
    assert np.allclose(_encode(tower, True), updated, atol=1e-5)


def test_frozen_bf16_compile_equals_eager_and_follows_weight_updates(tiny_bert_dir):
    """The bf16 path compiles its inference copy with frozen weights: bf16 eager's vectors, and a weight
    update makes a new copy, hence a new (frozen) compile that sees the new weights."""
    tower = DualEncoder.load(tiny_bert_dir).doc_tower

    def bf16(compile):
        return encode_texts(tower, TEXTS, batch_size=3, precision="bf16", show_progress=False, compile=compile)

    assert np.allclose(bf16(True), bf16(False), atol=2e-2)
    assert inference.bf16_copy(tower).__dict__["_compiled_forward"] is not None
    with torch.no_grad():
        tower.backbone.get_input_embeddings().weight.mul_(1.5)
    eager = bf16(False)
    assert np.allclose(bf16(True), eager, atol=2e-2)
    assert not np.allclose(eager, encode_texts(DualEncoder.load(tiny_bert_dir).doc_tower, TEXTS, batch_size=3,
                                               precision="bf16", show_progress=False), atol=2e-2)


def test_compiled_tower_copies_without_its_caches(tiny_bert_dir):
    """A tower compiled in fp32 still makes its bf16 copy (and ADE / MoCo deep copies): the compiled forward
    and the bf16 cache are derived state that a copy leaves out and rebuilds."""
    import copy
    import pickle

    tower = DualEncoder.load(tiny_bert_dir).doc_tower
    fp32 = _encode(tower, True)
    bf16 = encode_texts(tower, TEXTS, batch_size=3, precision="bf16", show_progress=False, compile=True)
    assert np.allclose(bf16, fp32, atol=5e-2)
    for clone in (copy.deepcopy(tower), pickle.loads(pickle.dumps(tower))):
        assert "_compiled_forward" not in clone.__dict__ and "_bf16_cache" not in clone.__dict__
        assert np.allclose(_encode(clone, False), fp32, atol=1e-5)
    assert "_compiled_forward" in tower.__dict__ and "_bf16_cache" in tower.__dict__


def test_compile_failure_falls_back_to_eager(tiny_bert_dir, monkeypatch, caplog):
    def broken(module, **kwargs):
        def fail(*args):
            raise RuntimeError("InductorError: no working C++ compiler found\nmore detail")
        return fail

    monkeypatch.setattr(torch, "compile", broken)
    tower = DualEncoder.load(tiny_bert_dir).doc_tower
    with caplog.at_level(logging.WARNING, logger="twotower.encoders.inference"):
        got = _encode(tower, True)
    assert np.allclose(got, _encode(tower, False), atol=1e-6)
    assert "torch.compile failed (RuntimeError: InductorError: no working C++ compiler found)" in caplog.text


@pytest.mark.parametrize("command", [
    ["eval", "--retriever", "dense", "--out", "{tmp}/r.json"],
    ["index", "build", "--out", "{tmp}/index"],
])
def test_cli_compile_flag_reaches_document_encoding(command, tiny_beir, tiny_bert_dir, tmp_path, monkeypatch):
    """``--compile`` on eval and index build compiles the document tower; without it nothing is compiled."""
    compiled = []

    def record(encoder, **kwargs):
        compiled.append(encoder)
        return encoder

    monkeypatch.setattr(inference, "compiled_forward", record)
    args = [a.format(tmp=tmp_path) for a in command]
    base = [*args, "--data", str(tiny_beir), "--model", str(tiny_bert_dir), "--precision", "fp32", "--no-progress"]
    runner = CliRunner()
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    assert compiled == []
    res = runner.invoke(app, [*base, "--compile", *(["--replace"] if command[0] == "index" else [])])
    assert res.exit_code == 0, res.output
    assert len(compiled) == 1
    if command[0] == "eval":
        assert json.loads((tmp_path / "r.json").read_text())["metrics"]
