"""Tower variants: exactly which parameters are shared, frozen or separate; save/load round trips."""

from __future__ import annotations

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


def test_shared_save_loads_in_sentence_transformers(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = DualEncoder.build(tiny_bert_dir, dim=12)
    model.save(tmp_path / "m")
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    theirs = st.encode(TEXTS, convert_to_numpy=True)
    assert theirs.shape == (3, 12)
    assert np.allclose(theirs, model.encode_documents(TEXTS, OPTS), atol=1e-5)


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
