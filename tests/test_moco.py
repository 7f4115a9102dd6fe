"""MoCo queue and momentum encoder, the pre-training objective on the Trainer, exact resume, CLI."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from twotower.cli import app
from twotower.data.augment import ViewConfig
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.errors import TwoTowerError
from twotower.training.batching import batch_indices
from twotower.training.losses import InBatchSoftmaxLoss, moco_loss
from twotower.training.moco import KeyQueue, momentum_update
from twotower.training.pretrain import ContrastivePretraining, PretrainConfig
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

TEXT = [
    "Cats are small domesticated felines. They purr when content. Many people keep them as pets at home.",
    "Dogs are loyal animals. They bark at strangers. Dogs were domesticated from wolves long ago.",
    "Python is a programming language. It has dynamic typing. Its standard library is large and useful.",
    "Rust is a systems language. It focuses on memory safety. The borrow checker enforces ownership rules.",
    "Green tea is brewed from leaves. It contains caffeine. Tea has been drunk in China for millennia.",
    "The mitochondria is the powerhouse of the cell. It makes energy. Cells can have many mitochondria.",
]


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXT)))
    return path


def test_queue_order_and_wrap_around():
    q = KeyQueue(5, 2)
    rows = lambda a, b: torch.arange(a, b, dtype=torch.float32)[:, None].repeat(1, 2)  # noqa: E731
    q.push(rows(0, 3))
    assert len(q) == 3 and q.contents()[:, 0].tolist() == [0, 1, 2]
    q.push(rows(3, 7))  # wraps: 5 and 6 overwrite 0 and 1
    assert len(q) == 5 and q.ptr == 2 and q.contents()[:, 0].tolist() == [2, 3, 4, 5, 6]
    assert q.keys[:, 0].tolist() == [5, 6, 2, 3, 4]
    q.push(rows(7, 15))  # more than the queue holds: only the newest 5 stay
    assert q.contents()[:, 0].tolist() == [10, 11, 12, 13, 14]
    other = KeyQueue(5, 2)
    other.load_state_dict(q.state_dict())
    assert torch.equal(other.contents(), q.contents()) and other.ptr == q.ptr
    other.push(rows(15, 16))
    assert other.contents()[:, 0].tolist() == [11, 12, 13, 14, 15]
    with pytest.raises(ValueError, match="resume with the same queue_size and model"):
        KeyQueue(4, 2).load_state_dict(q.state_dict())
    from twotower.checks import cli_names

    with cli_names(), pytest.raises(ValueError, match="resume with the same --queue-size and model"):
        KeyQueue(4, 2).load_state_dict(q.state_dict())


def test_momentum_update_formula():
    torch.manual_seed(0)
    query = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    key = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    query[1].running_mean.fill_(2.0)
    before = {n: p.clone() for n, p in key.named_parameters()}
    momentum_update(key, query, 0.9)
    for n, p in key.named_parameters():
        expected = 0.9 * before[n] + 0.1 * dict(query.named_parameters())[n]
        assert torch.allclose(p, expected, atol=1e-7), n
    assert torch.equal(key[1].running_mean, query[1].running_mean)
    momentum_update(key, query, 0.0)  # m = 0: a copy
    assert all(torch.equal(p, q) for p, q in zip(key.parameters(), query.parameters()))


def _trainer(tmp_path, tiny_bert_dir, corpus, negatives="moco", *, towers="sde", steps=3, queue=8, momentum=0.9,
             name="run", checkpoint_every=100, cache_chunk=None):
    cfg = TrainConfig(out=str(tmp_path / name), model=str(tiny_bert_dir), towers=towers, precision="fp32",
                      show_progress=False, checkpoint_every=checkpoint_every, keep_checkpoints=10,
                      stages=[StageConfig(name="pretrain", steps=steps, batch_size=3, lr=1e-3, warmup=0.0,
                                          cache_chunk=cache_chunk)])
    objective = ContrastivePretraining(PretrainConfig(
        corpus=str(corpus), views=ViewConfig(chunk_tokens=16, min_tokens=4, replace=0.1),
        negatives=negatives, queue_size=queue, momentum=momentum))
    return Trainer(cfg, objective=objective), objective


def test_moco_step_gradient_only_through_queries_and_momentum(tmp_path, tiny_bert_dir, corpus):
    trainer, obj = _trainer(tmp_path, tiny_bert_dir, corpus)
    obj.setup(trainer)
    chunks = obj.examples(trainer.config.stages[0])
    assert len(chunks) >= 6
    model = trainer.model
    model.eval()  # no dropout: the reference below must see the same network
    obj.queue.push(torch.nn.functional.normalize(torch.randn(5, model.dim), dim=-1))
    queue_before = obj.queue.negatives().clone()
    key_before = {n: p.clone() for n, p in obj.key_encoder.named_parameters()}
    with torch.no_grad():  # stands in for an optimizer step: θq moves away from θk
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    batch = chunks[:3]
    stage = trainer.config.stages[0]
    loss = obj.step_loss(trainer, batch, stage, None, random.Random(7))
    q_params = dict(model.query_tower.named_parameters())
    for n, p in obj.key_encoder.named_parameters():
        assert not p.requires_grad and p.grad is None, n
        assert torch.allclose(p, 0.9 * key_before[n] + 0.1 * q_params[n].detach(), atol=1e-6), n
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads
    # reference: the same views, InBatch-with-queue loss where only the queries carry a graph
    model.zero_grad(set_to_none=True)
    qv, kv = obj.views(batch, random.Random(7))
    q = model.forward_queries(*obj.inputs(model.query_tower, qv, model.query_max_length))
    with torch.no_grad():
        k = obj.key_encoder(*obj.inputs(model.doc_tower, kv, model.doc_max_length, "document"))
    ref = moco_loss(q, k, queue_before, 0.05)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(grads[n], p.grad, atol=1e-6), n
    # the new keys joined the queue, newest last
    assert len(obj.queue) == 8 and torch.allclose(obj.queue.contents()[-3:], k, atol=1e-6)


def test_moco_gradcache_matches_plain_step(tmp_path, tiny_bert_dir, corpus):
    runs = []
    for chunk in (None, 2):
        trainer, obj = _trainer(tmp_path, tiny_bert_dir, corpus, cache_chunk=chunk, name=f"gc{chunk}")
        obj.setup(trainer)
        trainer.model.eval()
        batch = obj.examples(trainer.config.stages[0])[:3]
        stage = trainer.config.stages[0]
        loss = obj.step_loss(trainer, batch, stage, None, random.Random(1))
        runs.append((loss, {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}))
    assert runs[0][0].item() == pytest.approx(runs[1][0].item(), rel=1e-5)
    for n, g in runs[0][1].items():
        assert torch.allclose(g, runs[1][1][n], atol=1e-5), n


def test_inbatch_gives_gradients_to_both_views(tmp_path, tiny_bert_dir, corpus):
    trainer, obj = _trainer(tmp_path, tiny_bert_dir, corpus, negatives="inbatch", towers="ade")
    obj.setup(trainer)
    model = trainer.model
    model.eval()
    stage = trainer.config.stages[0]
    batch = obj.examples(stage)[:3]
    loss_fn = InBatchSoftmaxLoss(0.05)
    loss = obj.step_loss(trainer, batch, stage, loss_fn, random.Random(3))
    for tower in (model.query_tower, model.doc_tower):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())
    qv, kv = obj.views(batch, random.Random(3))
    with torch.no_grad():
        ref = loss_fn(model.forward_queries(*obj.inputs(model.query_tower, qv, 64)),
                      model.forward_documents(*obj.inputs(model.doc_tower, kv, 64, "document")))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert obj.state_dict() == {}


def test_moco_needs_shared_towers(tmp_path, tiny_bert_dir, corpus):
    trainer, obj = _trainer(tmp_path, tiny_bert_dir, corpus, towers="ade")
    with pytest.raises(TwoTowerError, match="shared towers"):
        obj.setup(trainer)


def test_resume_restores_queue_and_key_encoder_exactly(tmp_path, tiny_bert_dir, corpus):
    """A run resumed from its step-2 checkpoint ends with the weights, key encoder and queue of the
    uninterrupted run (a queue of 8 keys: it wraps around)."""
    full, obj_full = _trainer(tmp_path, tiny_bert_dir, corpus, steps=6, checkpoint_every=2, name="full")
    full.train()
    ckpt = tmp_path / "full" / "checkpoints" / "step-00000002"
    assert (ckpt / "objective.pt").is_file()
    saved = torch.load(ckpt / "objective.pt", weights_only=True)
    assert int(saved["queue"]["count"]) == 6 and int(saved["queue"]["ptr"]) == 6
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, tmp_path / "resumed" / "checkpoints" / ckpt.name)
    resumed, obj_res = _trainer(tmp_path, tiny_bert_dir, corpus, steps=6, checkpoint_every=2, name="resumed")
    resumed.train(resume=True)
    pushed = sum(len(batch_indices(42, 0, s, len(obj_full._chunks), 3, 0, 1)) for s in range(6))
    assert pushed > 8 and len(obj_full.queue) == 8 and obj_full.queue.ptr == pushed % 8
    assert torch.equal(obj_full.queue.contents(), obj_res.queue.contents())
    assert obj_full.queue.ptr == obj_res.queue.ptr
    for (n, a), b in zip(obj_full.key_encoder.state_dict().items(), obj_res.key_encoder.state_dict().values()):
        assert torch.equal(a, b), n
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    log_a = json.loads((tmp_path / "full" / "train_log.json").read_text())
    log_b = json.loads((tmp_path / "resumed" / "train_log.json").read_text())
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]
    # without the MoCo state the key encoder restarts from the resumed weights: the run differs
    (tmp_path / "bare" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, tmp_path / "bare" / "checkpoints" / ckpt.name)
    (tmp_path / "bare" / "checkpoints" / ckpt.name / "objective.pt").unlink()
    bare, _ = _trainer(tmp_path, tiny_bert_dir, corpus, steps=6, checkpoint_every=2, name="bare")
    with pytest.raises(TwoTowerError, match="holds no MoCo key encoder"):
        bare.train(resume=True)


def test_pretrain_cli_output_loads_for_eval_and_training(tmp_path, tiny_bert_dir, corpus):
    out = tmp_path / "cli"
    args = ["pretrain", "--corpus", str(corpus), "--out", str(out), "--model", str(tiny_bert_dir), "--augment", "ict",
            "--negatives", "moco", "--queue-size", "16", "--momentum", "0.99", "--steps", "2", "--batch-size", "3",
            "--chunk-tokens", "24", "--precision", "fp32", "--no-progress"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads((out / "pretrain_config.json").read_text())["views"]["augment"] == "ict"
    assert [r["step"] for r in json.loads((out / "train_log.json").read_text())] == [1, 2]
    loaded = DualEncoder.load(out / "model")  # what `twotower eval --model` does
    assert loaded.encode_queries(["cats"], EncodeOptions(show_progress=False)).shape == (1, 32)
    DualEncoder.build(out / "model")  # what `twotower train --model` does
    bad = CliRunner().invoke(app, [*args[:-1], "--augment", "bogus"])
    assert bad.exit_code == 2 and "unknown augment 'bogus'" in bad.output


def test_views_go_behind_the_models_prompts(tmp_path, tiny_bert_dir, corpus):
    """A model with prompts (multilingual-e5's "query: " / "passage: "): the query view is encoded as the tokenizer
    encodes "query: <view text>", the key view as "passage: <view text>"; without prompts, the bare view."""
    trainer, obj = _trainer(tmp_path, tiny_bert_dir, corpus)
    obj.setup(trainer)
    tower = trainer.model.query_tower
    tok = tower.tokenizer
    views = [np.array(tok("the cat sat on a mat", add_special_tokens=False)["input_ids"])]
    bare, _ = obj.inputs(tower, views, 64, "query")
    assert bare[0].tolist() == tok("the cat sat on a mat")["input_ids"]
    tower.prompts = {"query": "query: ", "document": "passage: "}
    q_ids, q_mask = obj.inputs(tower, views, 64, "query")
    k_ids, _ = obj.inputs(tower, views, 64, "document")
    assert q_ids[0].tolist() == tok("query: the cat sat on a mat")["input_ids"] and bool(q_mask.all())
    assert k_ids[0].tolist() == tok("passage: the cat sat on a mat")["input_ids"]
    cut, _ = obj.inputs(tower, views, 6, "query")  # the prompt keeps its place, the view is cut
    assert cut[0].tolist()[:4] == tok("query: the")["input_ids"][:4] and cut.shape[1] == 6
