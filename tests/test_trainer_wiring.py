"""The Trainer's wiring of GTR's loss: a batch with duplicate positives and hard negatives gives the
loss and gradients of the bi-directional in-batch softmax written out by hand below (in-batch copies
of a query's positives left out of its denominators, every hard negative in the query→document
denominators), both for one ``_step_loss`` and for the first logged step of a ``train()`` run."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch

from conftest import copy_without_dropout
from twotower.data.pairs import TrainExample, save_pairs
from twotower.errors import TwoTowerError
from twotower.training.batching import false_negative_mask
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

TAU = 0.05
CATS = "Cats are small domesticated felines that purr."
RUST = "Rust is a systems programming language focused on memory safety."
PYTHON = "Python is a programming language with dynamic typing."
TEA = "Green tea is brewed from the leaves of Camellia sinensis."
CELL = "The mitochondria is the powerhouse of the cell."
NEGS = ["Dogs are loyal animals that bark at strangers.", "Oolong is a partly oxidised tea.",
        "Kittens purr when they are content.", "The borrow checker enforces ownership rules.",
        "Cells can have many mitochondria.", "Tea has been drunk in China for millennia."]
# (query, qid, positive, pid): 0 and 1 share a positive (d1), 2 and 3 are one query with two positives
ROWS = [("which feline purrs", "q1", CATS, "d1"),
        ("small pets that purr", "q2", CATS, "d1"),
        ("memory safe systems language", "q3", RUST, "d4"),
        ("memory safe systems language", "q3", PYTHON, "d3"),
        ("how is green tea made", "q4", TEA, "d5"),
        ("powerhouse of the cell", "q5", CELL, "d6")]
DUPLICATES = {(0, 1), (1, 0), (2, 3), (3, 2)}  # (i, j): document j is a positive of query i, j ≠ i
HARD = 2  # every example has exactly HARD negatives, so all of them are used whatever the RNG draws


def _examples(with_ids: bool) -> list[TrainExample]:
    return [TrainExample(q, p, negatives=[NEGS[i], NEGS[(i + 3) % 6]], qid=qid if with_ids else "",
                         pid=pid if with_ids else "") for i, (q, qid, p, pid) in enumerate(ROWS)]


def gtr_loss(q: torch.Tensor, d: torch.Tensor, h: torch.Tensor, duplicates: set, tau: float) -> torch.Tensor:
    """GTR's loss by hand: mean over queries of −log softmax over (positives not duplicating its own,
    all hard negatives), averaged with mean over positives of −log softmax over (queries whose
    positive it is not)."""
    b = len(q)
    forward, backward = [], []
    for i in range(b):
        own = q[i] @ d[i] / tau
        others = [q[i] @ d[j] / tau for j in range(b) if j != i and (i, j) not in duplicates]
        negatives = [q[i] @ h[k] / tau for k in range(len(h))]
        forward.append(torch.logsumexp(torch.stack([own, *others, *negatives]), 0) - own)
        back_others = [d[i] @ q[j] / tau for j in range(b) if j != i and (j, i) not in duplicates]
        backward.append(torch.logsumexp(torch.stack([own, *back_others]), 0) - own)
    return (torch.stack(forward).mean() + torch.stack(backward).mean()) / 2


def _embed(model, examples):
    """Queries, positives and all hard negatives embedded in one padded batch each (no buckets)."""
    def run(fn, tower, texts, max_length):
        batch = tower.tokenize(texts, max_length=max_length)
        return fn(batch["input_ids"], batch["attention_mask"])

    q = run(model.forward_queries, model.query_tower, [e.query for e in examples], model.query_max_length)
    d = run(model.forward_documents, model.doc_tower, [e.positive for e in examples], model.doc_max_length)
    h = run(model.forward_documents, model.doc_tower, [n for e in examples for n in e.negatives], model.doc_max_length)
    return q, d, h


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_bert_dir) -> Path:
    """The tiny BERT without dropout: the trainer's forward pass and the reference's are the same function."""
    return copy_without_dropout(tiny_bert_dir, tmp_path_factory.mktemp("wiring") / "model")


def _trainer(out: Path, model_dir: Path, towers: str, **stage) -> Trainer:
    st = StageConfig(hard_negatives=HARD, temperature=TAU, batch_size=len(ROWS), warmup=0.0, **stage)
    return Trainer(TrainConfig(out=str(out), model=str(model_dir), towers=towers, dim=16, precision="fp32",
                               show_progress=False, checkpoint_every=1000, stages=[st]))


def test_false_negative_mask_by_hand():
    for with_ids in (True, False):  # ids when given, else the texts themselves
        mask = false_negative_mask(_examples(with_ids))
        assert {(i, j) for i, j in mask.nonzero().tolist()} == DUPLICATES


@pytest.mark.parametrize("towers,with_ids", [("sde", True), ("ade", False)])
def test_step_loss_and_gradients_equal_gtr_loss_by_hand(model_dir, tmp_path, towers, with_ids):
    """``_step_loss`` on a batch with duplicates and hard negatives: its loss and every parameter's
    gradient are those of :func:`gtr_loss` (ade: queries reach only the query tower's weights,
    positives and negatives only the document tower's)."""
    trainer = _trainer(tmp_path / "run", model_dir, towers)
    model = trainer.model
    reference = copy.deepcopy(model)
    examples = _examples(with_ids)
    stage = trainer.config.stages[0]
    loss = trainer._step_loss(examples, stage, InBatchSoftmaxLoss(TAU), random.Random(0))
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    q, d, h = _embed(reference, examples)
    expected = gtr_loss(q, d, h, DUPLICATES, TAU)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # the test can tell: dropping the mask or the hard negatives moves the loss well beyond the tolerance
    with torch.no_grad():
        assert abs(gtr_loss(q, d, h, set(), TAU).item() - expected.item()) > 0.05
        assert abs(gtr_loss(q, d, h[:0], DUPLICATES, TAU).item() - expected.item()) > 0.05
        assert abs(gtr_loss(q, d, h[::HARD], DUPLICATES, TAU).item() - expected.item()) > 0.01
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys() and grads
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=2e-5, rtol=1e-4, msg=name)


def test_first_logged_loss_of_a_run_is_the_masked_loss_with_hard_negatives(model_dir, tmp_path):
    """Through ``train()`` (pairs file → batches → objective → loss): step 1's logged loss is
    :func:`gtr_loss` of the untrained model on the whole batch."""
    pairs = tmp_path / "pairs.jsonl"
    save_pairs(_examples(True), pairs)
    trainer = _trainer(tmp_path / "run", model_dir, "sde", pairs=str(pairs), steps=1, lr=1e-4)
    with torch.no_grad():
        expected = gtr_loss(*_embed(trainer.model, _examples(True)), DUPLICATES, TAU).item()
    trainer.train()
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    assert len(log) == 1 and log[0]["loss"] == pytest.approx(expected, rel=1e-5)


def test_batch_texts_draws_each_examples_own_negatives(model_dir, tmp_path):
    trainer = _trainer(tmp_path / "run", model_dir, "sde")
    examples = [TrainExample(f"q{i}", f"p{i}", negatives=[f"n{i}.{k}" for k in range(4)]) for i in range(5)]
    stage = StageConfig(hard_negatives=3)
    queries, positives, negatives = trainer.batch_texts(examples, stage, random.Random(5))
    assert queries == [e.query for e in examples] and positives == [e.positive for e in examples]
    assert len(negatives) == 15
    for i, e in enumerate(examples):  # three distinct negatives of example i, in example order
        drawn = negatives[3 * i : 3 * i + 3]
        assert len(set(drawn)) == 3 and set(drawn) <= set(e.negatives)
    assert trainer.batch_texts(examples, stage, random.Random(5))[2] == negatives  # the step's seed decides
    assert trainer.batch_texts(examples, StageConfig(hard_negatives=0), random.Random(5))[2] == []
    with pytest.raises(TwoTowerError, match="asks for 5 hard negatives per query but an example has 4"):
        trainer.batch_texts(examples, StageConfig(hard_negatives=5), random.Random(5))


def test_the_trainer_is_the_training_loop_objectives_see(model_dir, tmp_path):
    """Objectives type against ``objective.TrainingLoop`` (so that objective.py need not import the trainer, which
    imports it): every attribute and method of that protocol is on a Trainer, methods with the same parameters."""
    import inspect

    from twotower.training.objective import TrainingLoop

    trainer = _trainer(tmp_path / "out", model_dir, "sde")
    for name in TrainingLoop.__annotations__:
        assert hasattr(trainer, name), f"Trainer has no attribute {name}"
    methods = [n for n, v in vars(TrainingLoop).items() if inspect.isfunction(v) and not n.startswith("__")]
    assert {"batch_texts", "backward", "_step_loss"} <= set(methods)
    for name in methods:
        assert list(inspect.signature(getattr(TrainingLoop, name)).parameters) == \
            list(inspect.signature(getattr(Trainer, name)).parameters), name
