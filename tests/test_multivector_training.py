"""ME-BERT training: the max score over the first m document token vectors with in-batch negatives."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import TINY_CORPUS, copy_without_dropout, write_beir
from twotower.data.pairs import TrainExample
from twotower.encoders.towers import DualEncoder, EncodeOptions
from twotower.errors import TwoTowerError
from twotower.retrieval.multivector import document_token_vectors, encode_multivector, maxsim, maxsim_scores
from twotower.training.batching import false_negative_mask
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.multivector import MultiVectorObjective, multivector_scores
from twotower.training.trainer import StageConfig, TrainConfig, Trainer

QUERIES = [{"_id": f"q{i}", "text": t} for i, t in enumerate(
    ["which feline purrs", "loyal barking animal", "dynamic typing language", "memory safe systems language",
     "how is green tea made", "powerhouse of the cell"])]
QRELS = [(q["_id"], d["_id"], 1) for q, d in zip(QUERIES, TINY_CORPUS)]


@pytest.fixture(scope="module")
def train_setup(tmp_path_factory, tiny_bert_dir) -> tuple[Path, Path]:
    """6 judged train pairs (one batch) and the tiny BERT without dropout (a deterministic loss)."""
    root = tmp_path_factory.mktemp("mv-train")
    data = write_beir(root / "data", TINY_CORPUS, QUERIES, QRELS, split="train")
    return data, copy_without_dropout(tiny_bert_dir, root / "model")


def _ids(tower, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = tower.tokenize(texts)
    return batch["input_ids"], batch["attention_mask"]


def _config(out: Path, data: Path, model: Path, *, m: int = 4, steps: int = 1, lr: float = 1e-3,
            **extra) -> TrainConfig:
    stage = StageConfig(data=str(data), batch_size=6, steps=steps, lr=lr, warmup=0.0, temperature=0.05,
                        **{k: v for k, v in extra.items() if k in StageConfig.__dataclass_fields__})
    return TrainConfig(out=str(out), model=str(model), multivector=m, precision="fp32", show_progress=False,
                       checkpoint_every=1000, stages=[stage],
                       **{k: v for k, v in extra.items() if k in TrainConfig.__dataclass_fields__})


def test_maxsim_equals_brute_force_and_padding_never_wins():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 8, generator=gen)
    vectors = torch.randn(7, 4, 8, generator=gen)
    mask = torch.rand(7, 4, generator=gen) > 0.4
    mask[:, 0] = True  # every document has its [CLS]
    vectors[~mask] = 100 * q[0]  # padding rows that would win every max if they were scored
    scores = maxsim(q, vectors, mask)
    expected = torch.empty(5, 7)
    for i in range(5):
        for j in range(7):
            expected[i, j] = max(float(q[i] @ vectors[j, t]) for t in range(4) if mask[j, t])
    torch.testing.assert_close(scores, expected)
    # with hard negatives: queries × (positives, negatives); the back scores are the in-batch block transposed
    hard_v, hard_m = torch.randn(3, 4, 8, generator=gen), torch.ones(3, 4, dtype=torch.bool)
    s, back = multivector_scores(q, (vectors[:5], mask[:5]), (hard_v, hard_m))
    assert s.shape == (5, 8)
    torch.testing.assert_close(s[:, :5], expected[:, :5])
    torch.testing.assert_close(s[:, 5:], maxsim(q, hard_v, hard_m))
    torch.testing.assert_close(back, expected[:, :5].T)


def test_token_vectors_ignore_padding_of_short_documents(tiny_bert_dir):
    """A short document in a batch with a long one gets the same vectors and scores as alone; its
    padding positions are masked and never score."""
    tower = DualEncoder.load(tiny_bert_dir).doc_tower.eval()
    texts = ["a b", "a much longer text with many tokens in it and more"]
    ids, att = _ids(tower, texts)
    with torch.no_grad():
        vecs, mask = document_token_vectors(tower, ids, att, 8)
        v1, m1 = document_token_vectors(tower, *_ids(tower, texts[:1]), 8)
    assert mask.tolist() == [[True] * 4 + [False] * 4, [True] * 8] and vecs.shape == (2, 8, 32)
    assert m1.tolist() == [[True] * 4 + [False] * 4]  # padded up to m although the batch has only 4 tokens
    torch.testing.assert_close(vecs[0, :4], v1[0, :4], atol=1e-5, rtol=1e-5)
    q = torch.nn.functional.normalize(vecs[0, 5:6] + vecs[0, 6:7], dim=-1)  # aimed at padding rows
    torch.testing.assert_close(maxsim(q, vecs[:1], mask[:1]), maxsim(q, v1, m1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="left-padded"):
        document_token_vectors(tower, ids.flip(1), att.flip(1), 2)


def test_m1_with_cls_pooling_is_the_single_vector_loss(tiny_bert_dir):
    """m = 1 scores the [CLS] vector: with cls pooling the loss is exactly InBatchSoftmaxLoss
    (temperature, both directions, hard negatives, false-negative mask)."""
    model = DualEncoder.build(tiny_bert_dir, pooling="cls", dim=16).eval()
    tower = model.doc_tower
    q_texts = [q["text"] for q in QUERIES[:4]]
    d_texts = [d["text"] for d in TINY_CORPUS[:4]]
    h_texts = [d["text"] for d in TINY_CORPUS[4:]]
    examples = [TrainExample("a", "x", qid="1"), TrainExample("b", "y", qid="2"), TrainExample("c", "z", qid="1"),
                TrainExample("d", "w", qid="3")]
    fn_mask = false_negative_mask(examples)
    loss_fn = InBatchSoftmaxLoss(temperature=0.05)
    with torch.no_grad():
        q = model.forward_queries(*_ids(tower, q_texts))
        d, h = model.forward_documents(*_ids(tower, d_texts)), model.forward_documents(*_ids(tower, h_texts))
        single = loss_fn(q, d, h, false_negative_mask=fn_mask)
        docs = document_token_vectors(tower, *_ids(tower, d_texts), 1)
        hard = document_token_vectors(tower, *_ids(tower, h_texts), 1)
        multi = loss_fn.from_scores(*multivector_scores(q, docs, hard), false_negative_mask=fn_mask)
    assert multi.item() == pytest.approx(single.item(), rel=1e-5)


def test_training_step_changes_weights_and_lowers_the_loss(train_setup, tmp_path):
    data, model_dir = train_setup
    before = DualEncoder.load(model_dir).state_dict()
    trainer = Trainer(_config(tmp_path / "run", data, model_dir, steps=10, lr=1e-2))
    # the first logged loss is the max-score softmax of the untouched model on the batch
    model = trainer.model
    examples = MultiVectorObjective(4).examples(trainer.config.stages[0])
    with torch.no_grad():
        q = model.forward_queries(*_ids(model.query_tower, [e.query for e in examples]))
        docs = document_token_vectors(model.doc_tower, *_ids(model.doc_tower, [e.positive for e in examples]), 4)
        expected = InBatchSoftmaxLoss(0.05).from_scores(*multivector_scores(q, docs),
                                                        false_negative_mask=false_negative_mask(examples))
    trainer.train()
    losses = [r["loss"] for r in json.loads((tmp_path / "run" / "train_log.json").read_text())]
    assert losses[0] == pytest.approx(expected.item(), rel=1e-4)
    # below ln 6 ≈ 1.79, the loss of equal scores for the 6 in-batch documents: it tells them apart
    assert losses[-1] < min(losses[0], 1.5), losses
    trained = DualEncoder.load(tmp_path / "run" / "model")
    changed = [k for k, v in trained.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert changed, "training changed no weight"
    assert trained.multivector == 4
    assert json.loads((tmp_path / "run" / "model" / "twotower.json").read_text())["multivector"] == 4


@pytest.mark.parametrize("towers,dim", [("sde", None), ("ade-spl", 16)])
def test_retrieval_scores_equal_training_scores(train_setup, tmp_path, towers, dim):
    """The index's vectors (encode_multivector) and the eval's queries (encode_queries) score the
    trained model's pairs exactly as its training forward pass does."""
    data, model_dir = train_setup
    Trainer(_config(tmp_path / "run", data, model_dir, m=3, steps=2, towers=towers, dim=dim)).train()
    model = DualEncoder.load(tmp_path / "run" / "model").eval()
    assert model.multivector == 3 and model.kind == towers
    q_texts = [q["text"] for q in QUERIES]
    d_texts = [d["text"] for d in TINY_CORPUS]
    with torch.no_grad():
        q = model.forward_queries(*_ids(model.query_tower, q_texts))
        training = maxsim(q, *document_token_vectors(model.doc_tower, *_ids(model.doc_tower, d_texts), 3))
    vecs, offsets = encode_multivector(model.doc_tower, d_texts, 3, precision="fp32", show_progress=False)
    assert vecs.shape[1] == (dim or 32)
    q_vecs = model.encode_queries(q_texts, EncodeOptions(precision="fp32", show_progress=False))
    retrieval = maxsim_scores(q_vecs, vecs, offsets, range(len(d_texts)))
    np.testing.assert_allclose(retrieval, training.numpy(), atol=1e-5)


def test_eval_uses_the_trained_m(train_setup, tmp_path, caplog):
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    data, model_dir = train_setup
    Trainer(_config(tmp_path / "run", data, model_dir, m=2, steps=1)).train()
    with caplog.at_level(logging.INFO, logger="twotower.evaluation.pipeline"):
        res = run_eval(EvalConfig(data=data, split="train", retriever="multivector",
                                  model=str(tmp_path / "run" / "model"), precision="fp32", show_progress=False))
    assert "first 2 token vectors" in caplog.text and res.num_queries == 6
    from twotower.retrieval.indexing import EncodeConfig, build_index

    store = build_index(data, tmp_path / "idx", model=str(tmp_path / "run" / "model"),
                        cfg=EncodeConfig(precision="fp32", show_progress=False))
    assert store.multivector == 2 and store.manifest["num_vectors"] > store.manifest["num_docs"]
    store.close()


def test_multivector_rejects_bad_options(train_setup, tmp_path):
    data, model_dir = train_setup
    with pytest.raises(TwoTowerError, match="at least 1"):
        MultiVectorObjective(0)
    with pytest.raises(TwoTowerError, match="gradient caching"):
        Trainer(_config(tmp_path / "run", data, model_dir, cache_chunk=2)).train()
    from twotower.cli import app

    res = CliRunner().invoke(app, ["train", "--data", str(data), "--model", str(model_dir),
                                   "--out", str(tmp_path / "r"), "--multivector", "2", "--hard-negatives", "model",
                                   "--no-progress"])
    assert res.exit_code != 0 and "--hard-negatives bm25 or none" in res.output


def test_cli_train_multivector(train_setup, tmp_path):
    from twotower.cli import app

    data, model_dir = train_setup
    out = tmp_path / "r"
    res = CliRunner().invoke(app, ["train", "--data", str(data), "--model", str(model_dir), "--out", str(out),
                                   "--multivector", "2", "--steps", "1", "--batch-size", "6", "--precision", "fp32",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "model" / "twotower.json").read_text())["multivector"] == 2
    assert json.loads((out / "train_config.json").read_text())["multivector"] == 2


def test_hard_negatives_and_duplicates_in_the_max_score_softmax(train_setup, tmp_path):
    """One ``train()`` step on a batch whose examples 0 and 5 are one query with two positives, 3 and
    4 two queries with one positive, and where every example brings 2 hard negatives: the logged loss is the max-score softmax written
    out by hand (both hard negatives in the query→document denominator, each duplicate out of both)."""
    from twotower.data.pairs import save_pairs

    _, model_dir = train_setup
    docs = [d["text"] for d in TINY_CORPUS]
    extra = ["Kittens purr when they are content.", "Oolong is a partly oxidised tea.", "Borrow checking in Rust.",
             "Cells can have many mitochondria.", "Wolves howl at night.", "Typing rules of Python 3."]
    rows = [(q["text"], q["_id"]) for q in QUERIES[:5]] + [(QUERIES[0]["text"], QUERIES[0]["_id"])]
    positives = [0, 1, 2, 3, 3, 5]  # examples 3 and 4: two queries with one positive
    examples = [TrainExample(q, docs[p], negatives=[extra[i], extra[(i + 2) % 6]], qid=qid, pid=f"d{p}")
                for i, ((q, qid), p) in enumerate(zip(rows, positives))]
    duplicates = {(0, 5), (5, 0), (3, 4), (4, 3)}
    pairs = tmp_path / "pairs.jsonl"
    save_pairs(examples, pairs)
    stage = StageConfig(pairs=str(pairs), batch_size=6, steps=1, lr=1e-4, hard_negatives=2, temperature=0.05)
    trainer = Trainer(TrainConfig(out=str(tmp_path / "run"), model=str(model_dir), multivector=2, precision="fp32",
                                  show_progress=False, stages=[stage]))
    model = trainer.model
    with torch.no_grad():
        q = model.forward_queries(*_ids(model.query_tower, [e.query for e in examples]))
        negatives = [n for e in examples for n in e.negatives]
        d_vec, d_mask = document_token_vectors(model.doc_tower, *_ids(model.doc_tower, [e.positive for e in examples]), 2)
        h_vec, h_mask = document_token_vectors(model.doc_tower, *_ids(model.doc_tower, negatives), 2)

    def score(i, vec, mask, j):  # max over document j's real token vectors
        return max(q[i] @ vec[j, t] for t in range(2) if mask[j, t]) / 0.05

    def loss(with_hard=True, mask_duplicates=True):
        dup = duplicates if mask_duplicates else set()
        fwd, back = [], []
        for i in range(6):
            own = score(i, d_vec, d_mask, i)
            cands = [own] + [score(i, d_vec, d_mask, j) for j in range(6) if j != i and (i, j) not in dup]
            cands += [score(i, h_vec, h_mask, k) for k in range(12)] if with_hard else []
            fwd.append(torch.logsumexp(torch.stack(cands), 0) - own)
            cands = [own] + [score(j, d_vec, d_mask, i) for j in range(6) if j != i and (j, i) not in dup]
            back.append(torch.logsumexp(torch.stack(cands), 0) - own)
        return ((torch.stack(fwd).mean() + torch.stack(back).mean()) / 2).item()

    expected = loss()
    # what dropping either would log instead: far outside the tolerance below
    assert abs(loss(with_hard=False) - expected) > 0.1 and abs(loss(mask_duplicates=False) - expected) > 0.01
    trainer.train()
    losses = [r["loss"] for r in json.loads((tmp_path / "run" / "train_log.json").read_text())]
    assert len(losses) == 1 and losses[0] == pytest.approx(expected, rel=1e-5)
