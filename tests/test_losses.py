"""Losses: values by hand, hard negatives, bi-directional term, false-negative masking, and the
cross-process gather (2 CPU processes, gloo) equal to the single-process full batch."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from twotower.training.losses import InBatchSoftmaxLoss, moco_loss


def test_one_direction_by_hand():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[0.8, 0.6], [0.6, 0.8]])
    loss = InBatchSoftmaxLoss(temperature=0.5, bidirectional=False)(q, d)
    l0 = -torch.log(torch.exp(torch.tensor(0.8 / 0.5)) / (torch.exp(torch.tensor(0.8 / 0.5)) + torch.exp(torch.tensor(0.6 / 0.5))))
    assert loss.item() == pytest.approx(l0.item(), rel=1e-6)  # both rows are symmetric


def test_hard_negatives_join_the_denominator():
    torch.manual_seed(0)
    q, d, h = torch.randn(4, 8), torch.randn(4, 8), torch.randn(6, 8)
    loss = InBatchSoftmaxLoss(temperature=0.1, bidirectional=False)(q, d, h)
    expected = F.cross_entropy(q @ torch.cat([d, h]).T / 0.1, torch.arange(4))
    assert torch.allclose(loss, expected)


def test_bidirectional_adds_document_to_query_term():
    torch.manual_seed(1)
    q, d = torch.randn(5, 8), torch.randn(5, 8)
    loss = InBatchSoftmaxLoss(temperature=0.2)(q, d)
    qd = F.cross_entropy(q @ d.T / 0.2, torch.arange(5))
    dq = F.cross_entropy(d @ q.T / 0.2, torch.arange(5))
    assert torch.allclose(loss, (qd + dq) / 2)


def test_false_negative_mask_removes_duplicates():
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    d = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # the same document twice
    mask = torch.tensor([[False, True], [True, False]])
    loss = InBatchSoftmaxLoss(temperature=0.1)(q, d, false_negative_mask=mask)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert InBatchSoftmaxLoss(temperature=0.1)(q, d).item() == pytest.approx(torch.log(torch.tensor(2.0)).item(), rel=1e-5)


def test_moco_loss_has_no_gradient_into_keys():
    q = torch.randn(3, 4, requires_grad=True)
    k = torch.randn(3, 4, requires_grad=True)
    moco_loss(q, k, torch.randn(5, 4)).backward()
    assert q.grad is not None and k.grad is None


def test_moco_loss_by_hand():
    """Two queries, their two keys and a one-key queue, τ = 0.5; every number written out.

    logits = q·[k0, k1, queue]ᵀ / τ: row 0 = [0.6, 0.8, −1.0] / 0.5 = [1.2, 1.6, −2.0],
    row 1 = [0.8, 0.6, 0.0] / 0.5 = [1.6, 1.2, 0.0]; the label of row i is column i (its own key).
    loss_0 = ln(e^1.2 + e^1.6 + e^−2) − 1.2 = ln(3.320117 + 4.953032 + 0.135335) − 1.2 = 0.929241
    loss_1 = ln(e^1.6 + e^1.2 + e^0) − 1.2 = ln(9.273149) − 1.2 = 1.027123;  mean 0.978182.
    Without the queue both rows are ln(e^1.2 + e^1.6) − 1.2 = ln(8.273149) − 1.2 = 0.913015.
    ∂loss/∂q_i = (Σ_j softmax_ij · n_j − k_i) / (τ · B), with softmax row 0 = [0.394853, 0.589052, 0.016095]
    and row 1 = [0.534126, 0.358036, 0.107838] over n = [k0, k1, queue]:
    row 0 = (0.394853·[0.6, 0.8] + 0.589052·[0.8, 0.6] + 0.016095·[−1, 0] − [0.6, 0.8]) / 1 = [0.092058, −0.130686]
    row 1 = (0.534126·[0.6, 0.8] + 0.358036·[0.8, 0.6] + 0.107838·[−1, 0] − [0.8, 0.6]) / 1 = [−0.300934, 0.042122]
    """
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    k = torch.tensor([[0.6, 0.8], [0.8, 0.6]])
    queue = torch.tensor([[-1.0, 0.0]])
    loss = moco_loss(q, k, queue, temperature=0.5)
    assert loss.item() == pytest.approx(0.978182, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(q.grad, torch.tensor([[0.092058, -0.130686], [-0.300934, 0.042122]]),
                               atol=2e-6, rtol=0)
    assert moco_loss(q, k, None, temperature=0.5).item() == pytest.approx(0.913015, abs=1e-6)
    assert moco_loss(q, k, queue[:0], temperature=0.5).item() == pytest.approx(0.913015, abs=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    enc = torch.nn.Linear(6, 4)  # same init on every rank
    torch.manual_seed(1)
    xq, xd, xh = torch.randn(8, 6), torch.randn(8, 6), torch.randn(4, 6)
    sl = slice(rank * 4, rank * 4 + 4)
    hl = slice(rank * 2, rank * 2 + 2)
    loss = InBatchSoftmaxLoss(temperature=0.1, gather_across_devices=True)(enc(xq[sl]), enc(xd[sl]), enc(xh[hl]))
    loss.backward()
    for p in enc.parameters():  # what DDP does: average gradients
        dist.all_reduce(p.grad)
        p.grad /= world
    total = loss.detach().clone()
    dist.all_reduce(total)
    results[rank] = (total.item() / world, [p.grad.clone() for p in enc.parameters()])
    dist.destroy_process_group()


def test_gather_across_two_processes_equals_full_batch():
    torch.manual_seed(0)
    enc = torch.nn.Linear(6, 4)
    torch.manual_seed(1)
    xq, xd, xh = torch.randn(8, 6), torch.randn(8, 6), torch.randn(4, 6)
    # the single-process reference: the whole batch; hard negatives ordered as the gather orders them
    loss = InBatchSoftmaxLoss(temperature=0.1)(enc(xq), enc(xd), enc(xh))
    loss.backward()
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    results = manager.dict()
    mp.start_processes(_worker, args=(2, _free_port(), results), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        dist_loss, grads = results[rank]
        assert dist_loss == pytest.approx(loss.item(), rel=1e-5)
        for g, p in zip(grads, enc.parameters()):
            assert torch.allclose(g, p.grad, atol=1e-6)
