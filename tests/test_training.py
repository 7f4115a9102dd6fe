"""Trainer, GradCache and mining on tiny random-weight models."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import TINY_CORPUS, write_beir
from twotower.data.beir import BeirDataset
from twotower.data.pairs import load_pairs, pairs_from_beir
from twotower.encoders.towers import DualEncoder
from twotower.errors import DataError, TwoTowerError
from twotower.training.batching import batch_indices
from twotower.training.gradcache import cached_backward
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.mining import add_hard_negatives
from twotower.training.trainer import StageConfig, TrainConfig, Trainer


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(model, texts):
    b = model.query_tower.tokenize(texts)
    return b["input_ids"], b["attention_mask"]


QUERIES = ["cats purr", "dogs bark loudly", "rust is memory safe", "green tea", "mitochondria power", "python typing"]
DOCS = [d["text"] for d in TINY_CORPUS]


@pytest.mark.parametrize("towers", ["sde", "ade-spl"])
def test_gradcache_equals_full_batch(tiny_bert_dir, towers):
    """Chunked GradCache gradients equal the plain full-batch step (dropout off for chunking)."""
    model = DualEncoder.build(tiny_bert_dir, towers=towers, dim=16)
    model.eval()  # chunks change dropout masks' shapes; compare with dropout off
    loss_fn = InBatchSoftmaxLoss(temperature=0.05)
    q_ids, q_mask = _batch(model, QUERIES)
    d_ids, d_mask = _batch(model, DOCS)
    loss = loss_fn(model.forward_queries(q_ids, q_mask), model.forward_documents(d_ids, d_mask))
    loss.backward()
    plain = _grads(model)
    model.zero_grad(set_to_none=True)
    cached_loss = cached_backward(
        [(model.forward_queries, q_ids, q_mask), (model.forward_documents, d_ids, d_mask)],
        lambda q, d: loss_fn(q, d), chunk_size=2)
    assert cached_loss.item() == pytest.approx(loss.item(), rel=1e-5)
    cached = _grads(model)
    assert plain.keys() == cached.keys() and plain
    for name in plain:
        assert torch.allclose(plain[name], cached[name], atol=1e-5), name


def test_gradcache_replays_dropout(tiny_bert_dir):
    """With dropout on and one chunk, the RNG replay makes GradCache match the plain step exactly."""
    model = DualEncoder.build(tiny_bert_dir)
    model.train()
    loss_fn = InBatchSoftmaxLoss(temperature=0.05)
    q_ids, q_mask = _batch(model, QUERIES)
    d_ids, d_mask = _batch(model, DOCS)
    torch.manual_seed(3)
    loss_fn(model.forward_queries(q_ids, q_mask), model.forward_documents(d_ids, d_mask)).backward()
    plain = _grads(model)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    cached_backward([(model.forward_queries, q_ids, q_mask), (model.forward_documents, d_ids, d_mask)],
                    lambda q, d: loss_fn(q, d), chunk_size=len(QUERIES))
    for name, g in _grads(model).items():
        assert torch.allclose(plain[name], g, atol=1e-6), name


def test_batch_indices_cover_each_epoch_and_split_across_ranks():
    seen = [i for step in range(4) for i in batch_indices(7, 0, step, 13, 4, 0, 1)]
    assert sorted(seen[:13]) == list(range(13))
    r0 = batch_indices(7, 0, 1, 13, 2, 0, 2)
    r1 = batch_indices(7, 0, 1, 13, 2, 1, 2)
    assert set(r0).isdisjoint(r1) and len(r0) == len(r1) == 2


def _train_beir(tmp_path):
    corpus = TINY_CORPUS + [{"_id": f"x{i}", "title": "", "text": f"filler document number {i} about topic {i % 3}"}
                            for i in range(10)]
    queries = [{"_id": f"q{i}", "text": t} for i, t in enumerate(QUERIES)]
    qrels = [(f"q{i}", f"d{i + 1}", 1) for i in range(6)] + [("q0", "x1", 1)]
    return write_beir(tmp_path / "train-beir", corpus, queries, qrels, split="train")


def test_mining_excludes_all_positives(tmp_path):
    root = _train_beir(tmp_path)
    ds = BeirDataset.load(root, "train")
    examples = pairs_from_beir(ds)
    ranked = {q: ["d1", "x1", "x2", "d2", "x3", "x4"] for q in ds.queries}
    mined = add_hard_negatives(examples, ds, ranked, num_negatives=3, rank_range=(1, 5), seed=0)
    for ex in mined:
        assert set(ex.negative_ids).isdisjoint(ds.qrels[ex.qid])
        assert len(ex.negative_ids) == 3 and set(ex.negative_ids) <= {"d1", "x1", "x2", "d2", "x3"}
    q0 = [e for e in mined if e.qid == "q0"][0]
    assert "x1" not in q0.negative_ids and "d1" not in q0.negative_ids


def test_train_saves_loadable_model(tmp_path, tiny_bert_dir):
    root = _train_beir(tmp_path)
    cfg = TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), dim=8, show_progress=False, precision="fp32",
                      stages=[StageConfig(data=str(root), batch_size=4, steps=3, lr=1e-3)])
    before = DualEncoder.build(tiny_bert_dir, dim=8).state_dict()
    Trainer(cfg).train()
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["loss"] > 0 for r in log)
    loaded = DualEncoder.load(tmp_path / "run" / "model")
    assert loaded.dim == 8
    changed = [k for k, v in loaded.state_dict().items() if k in before and "projection" not in k and not torch.equal(v, before[k])]
    assert changed, "training changed no backbone weight"


def test_stages_from_toml(tmp_path, tiny_bert_dir):
    root = _train_beir(tmp_path)
    toml = tmp_path / "stages.toml"
    toml.write_text(textwrap.dedent(f"""
        model = "{tiny_bert_dir}"
        precision = "fp32"
        [[stage]]
        name = "pretrain"
        data = "{root}"
        steps = 2
        batch_size = 3
        temperature = 0.05
        [[stage]]
        name = "finetune"
        data = "{root}"
        steps = 1
        lr = 1e-4
        batch_size = 4
        temperature = 0.01
    """))
    cfg = TrainConfig.from_toml(toml, out=str(tmp_path / "run"), show_progress=False)
    assert [s.name for s in cfg.stages] == ["pretrain", "finetune"] and cfg.stages[1].temperature == 0.01
    Trainer(cfg).train()
    assert (tmp_path / "run" / "stages" / "pretrain" / "twotower.json").is_file()
    assert (tmp_path / "run" / "model" / "twotower.json").is_file()
    bad = tmp_path / "bad.toml"
    bad.write_text("[[stage]]\nname = 'x'\nbogus = 1\n")
    with pytest.raises(TwoTowerError, match=r"stage 1: unknown keys \['bogus'\]"):
        TrainConfig.from_toml(bad, out="x")


def test_bad_pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"query": "a", "positive": "b"}\n{"query": "c", "positive": ""}\n')
    with pytest.raises(DataError, match=r"line 2, field 'positive': positive must be a non-empty string"):
        load_pairs(path)


RUN_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from twotower.training.trainer import StageConfig, TrainConfig, Trainer
cfg = TrainConfig(out=sys.argv[1], model=sys.argv[2], dim=8, precision="fp32", show_progress=False, checkpoint_every=2,
                  keep_checkpoints=5, stages=[StageConfig(data=sys.argv[3], batch_size=3, steps=10, lr=1e-3,
                  cache_chunk=2, warmup=0.2)])
Trainer(cfg).train(resume=sys.argv[4] == "resume")
"""


def test_kill_and_resume_ends_with_same_weights(tmp_path, tiny_bert_dir):
    """A run killed with SIGKILL after a checkpoint and resumed ends with the weights of an
    uninterrupted run (same data order, RNG, optimizer and scheduler state)."""
    root = _train_beir(tmp_path)
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run([sys.executable, str(script), str(full), str(tiny_bert_dir), str(root), "fresh"], check=True)
    proc = subprocess.Popen([sys.executable, str(script), str(killed), str(tiny_bert_dir), str(root), "fresh"])
    deadline = time.time() + 120
    while time.time() < deadline and not list((killed / "checkpoints").glob("step-00000004/state.json")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "model").exists(), "the run finished before it could be killed"
    assert list((killed / "checkpoints").glob("step-*/state.json"))
    subprocess.run([sys.executable, str(script), str(killed), str(tiny_bert_dir), str(root), "resume"], check=True)
    la = json.loads((full / "train_log.json").read_text())
    lb = json.loads((killed / "train_log.json").read_text())
    assert [r["loss"] for r in la] == pytest.approx([r["loss"] for r in lb], abs=1e-6)
    a = DualEncoder.load(full / "model").state_dict()
    b = DualEncoder.load(killed / "model").state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k



def test_attention_dropout_option(tiny_bert_dir, tiny_t5_dir, tmp_path):
    """--attention-dropout sets every self-attention layer's dropout for training (both towers of an ADE), the
    config keeping its own value; out-of-range rates and T5 (no separate attention rate) are refused."""
    from torch import nn

    from twotower.encoders.backbone import set_attention_dropout
    from twotower.encoders.towers import DualEncoder
    from twotower.errors import ModelError
    from twotower.training.trainer import TrainConfig, Trainer

    def rates(backbone):
        return [m.dropout.p for m in backbone.modules()
                if type(m).__name__.endswith("SelfAttention") and isinstance(m.dropout, nn.Dropout)]

    own = DualEncoder.load(tiny_bert_dir).doc_tower.backbone.config.attention_probs_dropout_prob
    assert own != 0.25
    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), model=str(tiny_bert_dir), towers="ade",
                                  attention_dropout=0.25, show_progress=False))
    for tower in (trainer.model.query_tower, trainer.model.doc_tower):
        assert len(rates(tower.backbone)) == tower.backbone.config.num_hidden_layers
        assert set(rates(tower.backbone)) == {0.25}
        assert tower.backbone.config.attention_probs_dropout_prob == own  # kept for saving
    default = Trainer(TrainConfig(out=str(tmp_path / "run2"), model=str(tiny_bert_dir), show_progress=False))
    assert set(rates(default.model.doc_tower.backbone)) == {own}
    with pytest.raises(ModelError, match="BERT-family"):
        set_attention_dropout(DualEncoder.load(tiny_t5_dir).doc_tower.backbone, 0.0)
    with pytest.raises(ModelError, match=r"\[0, 1\)"):
        set_attention_dropout(trainer.model.doc_tower.backbone, 1.0)
