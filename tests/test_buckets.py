"""Length-bucketed training steps: same embeddings, loss and gradients as the padded batch."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_CORPUS
from twotower.encoders.towers import DualEncoder
from twotower.training.buckets import embed_in_buckets, length_buckets
from twotower.training.losses import InBatchSoftmaxLoss

QUERIES = ["cats purr", "dogs bark loudly", "rust is memory safe", "green tea", "mitochondria power", "python typing"]
DOCS = [d["text"] for d in TINY_CORPUS]


def _batch(tower, texts):
    b = tower.tokenize(texts)
    return b["input_ids"], b["attention_mask"]


def test_length_buckets_sort_longest_first_and_cover_every_row():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    buckets = length_buckets(mask, 2)
    assert [b.tolist() for b in buckets] == [[1, 3], [0, 4], [2]]


def test_buckets_trim_each_bucket_to_its_longest_text():
    widths = []

    def fn(ids, mask):
        widths.append(ids.shape[1])
        assert bool(mask[:, -1].any())  # no all-padding column is left
        return mask.sum(dim=1, keepdim=True).float()

    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    out = embed_in_buckets(fn, torch.ones_like(mask), mask, 2)
    assert widths == [5, 2]
    assert out[:, 0].tolist() == [2, 5, 1, 3]  # back in the input order


def test_left_padded_or_small_batches_run_whole():
    calls = []

    def fn(ids, mask):
        calls.append(ids.shape)
        return ids.float()

    left = torch.tensor([[0, 0, 1], [0, 1, 1], [1, 1, 1]])
    assert torch.equal(embed_in_buckets(fn, left, left, 1), left.float())
    right = torch.tensor([[1, 0, 0], [1, 1, 0]])
    embed_in_buckets(fn, right, right, 2)
    embed_in_buckets(fn, right, right, 0)
    assert calls == [(3, 3), (2, 3), (2, 3)]


@pytest.mark.parametrize("towers", ["sde", "ade"])
def test_bucketed_step_equals_padded_step(tiny_bert_dir, towers):
    """Embeddings, loss and every gradient equal the whole padded batch's (dropout off)."""
    model = DualEncoder.build(tiny_bert_dir, towers=towers, dim=16)
    model.eval()
    loss_fn = InBatchSoftmaxLoss(temperature=0.05)
    q_ids, q_mask = _batch(model.query_tower, QUERIES)
    d_ids, d_mask = _batch(model.doc_tower, DOCS)
    assert d_mask.sum(1).min() < d_mask.shape[1]  # the batch really has padding to remove
    whole = [model.forward_queries(q_ids, q_mask), model.forward_documents(d_ids, d_mask)]
    loss = loss_fn(*whole)
    loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    parts = [embed_in_buckets(model.forward_queries, q_ids, q_mask, 2),
             embed_in_buckets(model.forward_documents, d_ids, d_mask, 2)]
    for a, b in zip(whole, parts):
        assert torch.allclose(a, b, atol=1e-5)
    bucketed = loss_fn(*parts)
    assert bucketed.item() == pytest.approx(loss.item(), rel=1e-5)
    bucketed.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == plain.keys() and plain
    for name in plain:
        assert torch.allclose(plain[name], grads[name], atol=1e-5), name
