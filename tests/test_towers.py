"""Tower variants: exactly which parameters are shared, frozen or separate; save/load round trips."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from twotower.encoders.towers import TOWER_KINDS, DualEncoder, EncodeOptions

TEXTS = ["what is a cat", "rust memory safety", "tea leaves"]
OPTS = EncodeOptions(precision="fp32", show_progress=False)


def _ptrs(module) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in module.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("kind", TOWER_KINDS)
def test_sharing_per_variant(kind, tiny_bert_dir):
    model = DualEncoder.build(tiny_bert_dir, towers=kind, dim=16)
    q, d = model.query_tower, model.doc_tower
    q_ptr, d_ptr = _ptrs(q), _ptrs(d)
    assert q_ptr.keys() == d_ptr.keys()
    shared = {n for n in q_ptr if q_ptr[n] == d_ptr[n]}
    emb = "backbone.embeddings.word_embeddings.weight"
    proj = {"projection.linear.weight"}
    if kind == "sde":
        assert shared == set(q_ptr) and q is d
    elif kind == "ade":
        assert shared == set()
    elif kind == "ade-ste":
        assert shared == {emb}
    elif kind == "ade-fte":
        assert shared == set()
    elif kind == "ade-spl":
        assert shared == proj
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if kind == "ade-fte":
        assert frozen == {f"query_tower.{emb}", f"doc_tower.{emb}"}
    else:
        assert frozen == set()
    # every variant starts from the same checkpoint: towers give equal outputs before training
    assert np.allclose(model.encode_queries(TEXTS, OPTS), model.encode_documents(TEXTS, OPTS), atol=1e-5)


def test_ade_towers_diverge_when_trained_separately(tiny_bert_dir):
    model = DualEncoder.build(tiny_bert_dir, towers="ade-ste")
    with torch.no_grad():
        model.doc_tower.backbone.encoder.layer[0].output.dense.weight.add_(torch.randn(32, 64))
        assert torch.equal(model.query_tower.backbone.get_input_embeddings().weight,
                           model.doc_tower.backbone.get_input_embeddings().weight)
    assert not np.allclose(model.encode_queries(TEXTS, OPTS), model.encode_documents(TEXTS, OPTS), atol=1e-3)


def test_projection_bottleneck_and_similarity(tiny_bert_dir):
    model = DualEncoder.build(tiny_bert_dir, dim=8, similarity="dot", layer_norm=True)
    emb = model.encode_documents(TEXTS, OPTS)
    assert emb.shape == (3, 8) and model.similarity == "dot"
    assert not np.allclose(np.linalg.norm(emb, axis=1), 1.0)
    with pytest.raises(ValueError, match="unknown towers 'xde'"):
        DualEncoder.build(tiny_bert_dir, towers="xde")


@pytest.mark.parametrize("kind", ["sde", "ade-spl", "ade-ste"])
def test_save_load_round_trip(kind, tiny_bert_dir, tmp_path):
    model = DualEncoder.build(tiny_bert_dir, towers=kind, dim=16, layer_norm=True)
    with torch.no_grad():  # make the towers differ so the round trip is meaningful
        model.doc_tower.backbone.encoder.layer[1].output.dense.weight.add_(torch.randn(32, 64) * 0.3)
    model.save(tmp_path / "m")
    loaded = DualEncoder.load(tmp_path / "m")
    assert loaded.kind == kind
    assert np.allclose(model.encode_queries(TEXTS, OPTS), loaded.encode_queries(TEXTS, OPTS), atol=1e-6)
    assert np.allclose(model.encode_documents(TEXTS, OPTS), loaded.encode_documents(TEXTS, OPTS), atol=1e-6)
    if kind == "ade-spl":
        assert loaded.query_tower.projection is loaded.doc_tower.projection


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_in_sentence_transformers(path):
    """SentenceTransformer(path), with every message transformers logs (warning level and up) while it loads."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    records, hf_logger = _Records(), hf_logging.get_logger()  # the "transformers" root logger
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    hf_logger.addHandler(records)
    try:
        st = SentenceTransformer(str(path), device="cpu")
    finally:
        hf_logger.removeHandler(records)
        hf_logging.set_verbosity(verbosity)
    return st, records.messages


def _assert_quiet(messages):
    noisy = [m for m in messages if "MISSING" in m or "newly initialized" in m or "LOAD REPORT" in m]
    assert not noisy, noisy


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_t5_dir"])
def test_shared_save_loads_in_sentence_transformers_quietly(fixture, request, tmp_path):
    """A saved model loads in sentence-transformers with no load report (no pooler weights MISSING and "newly
    initialized") and gives twotower's embeddings."""
    model = DualEncoder.build(request.getfixturevalue(fixture), dim=12, layer_norm=True)
    model.save(tmp_path / "m")
    st, messages = _load_in_sentence_transformers(tmp_path / "m")
    _assert_quiet(messages)
    theirs = st.encode(TEXTS, convert_to_numpy=True)
    assert theirs.shape == (3, 12)
    assert np.allclose(theirs, model.encode_documents(TEXTS, OPTS), atol=1e-5)


def test_pooler_report_is_what_the_check_catches(tiny_bert_dir, tmp_path):
    """The check above can fail: without the saved ``add_pooling_layer: false`` transformers reports the pooler."""
    model = DualEncoder.build(tiny_bert_dir)
    model.save(tmp_path / "m")
    st_config = tmp_path / "m" / "sentence_bert_config.json"
    saved = json.loads(st_config.read_text())
    assert saved["model_args"] == {"add_pooling_layer": False}
    del saved["model_args"]
    st_config.write_text(json.dumps(saved))
    _, messages = _load_in_sentence_transformers(tmp_path / "m")
    assert any("pooler.dense.weight" in m and "MISSING" in m for m in messages), messages


def test_separate_towers_each_load_in_sentence_transformers_quietly(tiny_bert_dir, tmp_path):
    model = DualEncoder.build(tiny_bert_dir, towers="ade")
    with torch.no_grad():  # make the towers differ so each directory is checked against its own tower
        model.doc_tower.backbone.encoder.layer[1].output.dense.weight.add_(torch.randn(32, 64) * 0.3)
    model.save(tmp_path / "m")
    for folder, ours in (("query", model.encode_queries(TEXTS, OPTS)), ("document", model.encode_documents(TEXTS, OPTS))):
        st, messages = _load_in_sentence_transformers(tmp_path / "m" / folder)
        _assert_quiet(messages)
        assert np.allclose(st.encode(TEXTS, convert_to_numpy=True), ours, atol=1e-5), folder


@pytest.mark.parametrize("kind", ["ade-ste", "ade-fte"])
def test_shared_and_frozen_embedder_survive_save_and_load(kind, tiny_beir, tiny_bert_dir, tmp_path):
    """After save + load the ADE-STE towers still hold one token embedder (the same module, trained
    once for both) and the ADE-FTE embedders are still frozen (a training step leaves them as they
    were while the rest of both towers moves)."""
    from twotower.training.trainer import StageConfig, TrainConfig, Trainer

    built = DualEncoder.build(tiny_bert_dir, towers=kind, dim=16)
    built.save(tmp_path / "m")
    model = DualEncoder.load(tmp_path / "m")
    assert model.kind == kind
    q_emb = model.query_tower.backbone.get_input_embeddings()
    d_emb = model.doc_tower.backbone.get_input_embeddings()
    # the same set of distinct parameters as the model that was saved (a second embedder would add one)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in built.named_parameters()]
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if kind == "ade-ste":
        assert q_emb is d_emb and q_emb.weight.requires_grad and frozen == set()
    else:
        assert q_emb is not d_emb
        assert frozen == {"query_tower.backbone.embeddings.word_embeddings.weight",
                          "doc_tower.backbone.embeddings.word_embeddings.weight"}
    before = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    stage = StageConfig(data=str(tiny_beir), split="test", steps=1, batch_size=3, lr=1e-2, warmup=0.0)
    Trainer(TrainConfig(out=str(tmp_path / "run"), precision="fp32", show_progress=False, stages=[stage]),
            model=model).train()
    after = dict(model.named_parameters(remove_duplicate=False))
    q_w = after["query_tower.backbone.embeddings.word_embeddings.weight"]
    d_w = after["doc_tower.backbone.embeddings.word_embeddings.weight"]
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    if kind == "ade-ste":  # one embedder, updated by both towers' gradients: the towers' copies stay equal
        assert "query_tower.backbone.embeddings.word_embeddings.weight" in moved
        assert torch.equal(q_w, d_w)
    else:
        assert torch.equal(q_w, before["query_tower.backbone.embeddings.word_embeddings.weight"])
        assert torch.equal(d_w, before["doc_tower.backbone.embeddings.word_embeddings.weight"])
    for tower in ("query_tower", "doc_tower"):  # both towers trained
        assert f"{tower}.backbone.encoder.layer.0.attention.self.query.weight" in moved
