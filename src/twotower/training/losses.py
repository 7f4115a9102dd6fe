"""Contrastive losses for dual encoders (GTR eq. 1–2, Contriever's InfoNCE).

Expected inputs: ``q`` (B, dim) query embeddings, ``d`` (B, dim) their positive documents (row i
is query i's positive), optional ``hard`` (B·h, dim) extra negatives that join every query's
denominator. Scores are inner products (embeddings are already normalised for cosine) divided by
the temperature.

With ``gather_across_devices=True`` under ``torch.distributed``, every process's embeddings join
the denominator through an autograd-aware all-gather, so gradients reach the process that made
each embedding; averaging gradients across processes (as DDP does) then gives exactly the
gradient of the loss on the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward hands each process the gradient of its own rows, summed over the
    processes (every process's loss depends on every row). Public ``torch.distributed`` calls only: the autograd
    all-gather of ``torch.distributed.nn`` warns (FutureWarning) that it is deprecated, once per process."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        ctx.rows = slice(dist.get_rank() * x.shape[0], (dist.get_rank() + 1) * x.shape[0])
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone(memory_format=torch.contiguous_format)  # autograd's tensor is not ours to change
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rows]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all processes along dim 0 (every process passes the same shape), keeping
    gradients to every part."""
    if not _distributed():
        return x
    return _GatherWithGrad.apply(x)


def _offset() -> int:
    return dist.get_rank() if _distributed() else 0


@dataclass
class InBatchSoftmaxLoss:
    """In-batch sampled softmax with temperature; bi-directional and hard negatives optional.

    ``loss = mean_i −log softmax(q_i·[d; hard] / τ)_i`` (query → document), plus, when
    ``bidirectional``, ``mean_i −log softmax(d_i·q / τ)_i`` (document → query, GTR's second term;
    hard negatives have no query and stay out of it). The two directions are averaged.
    ``false_negative_mask`` (B, B), True where document j is also relevant to query i (j ≠ i),
    removes such in-batch "negatives" from the denominators (single process only).
    """

    temperature: float = 0.01
    bidirectional: bool = True
    gather_across_devices: bool = False

    def __call__(
        self,
        q: torch.Tensor,
        d: torch.Tensor,
        hard: torch.Tensor | None = None,
        false_negative_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if q.shape != d.shape:
            raise ValueError(f"queries {tuple(q.shape)} and positives {tuple(d.shape)} must have the same shape")
        q, d = q.float(), d.float()
        gather = self.gather_across_devices and _distributed()
        if gather and false_negative_mask is not None:
            raise ValueError("false_negative_mask is only supported in a single process")
        all_q = gather_with_grad(q) if gather else q
        all_d = gather_with_grad(d) if gather else d
        candidates = all_d
        if hard is not None and len(hard):
            candidates = torch.cat([all_d, gather_with_grad(hard.float()) if gather else hard.float()], dim=0)
        back = d @ all_q.T if self.bidirectional else None
        return self.from_scores(q @ candidates.T, back, false_negative_mask=false_negative_mask,
                                label_offset=_offset() * len(q) if gather else 0)

    def from_scores(
        self,
        scores: torch.Tensor,
        back_scores: torch.Tensor | None = None,
        *,
        false_negative_mask: torch.Tensor | None = None,
        label_offset: int = 0,
    ) -> torch.Tensor:
        """The same loss from precomputed similarity scores (before the temperature), for scores
        that are not one inner product per pair (e.g. ME-BERT's max over document vectors).

        ``scores`` (B, C): query i against the candidates, the (gathered) batch's positives first
        (its own at column ``label_offset + i``), then any hard negatives. ``back_scores`` (B, Bq):
        positive i against the (gathered) batch's queries (its own query at ``label_offset + i``);
        required when ``bidirectional``. ``false_negative_mask`` (B, B) as in :meth:`__call__`
        (single process: the in-batch block is ``scores[:, :B]``).
        """
        n = len(scores)
        labels = torch.arange(n, device=scores.device) + label_offset
        logits = scores.float() / self.temperature
        if false_negative_mask is not None:
            logits[:, :n] = logits[:, :n].masked_fill(false_negative_mask, float("-inf"))
        loss = F.cross_entropy(logits, labels)
        if self.bidirectional:
            if back_scores is None:
                raise ValueError("a bi-directional loss needs back_scores (each positive against the queries); "
                                 "pass them or use bidirectional=False")
            back = back_scores.float() / self.temperature
            if false_negative_mask is not None:
                back = back.masked_fill(false_negative_mask.T, float("-inf"))
            loss = (loss + F.cross_entropy(back, labels)) / 2
        return loss


def moco_loss(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor | None, temperature: float = 0.05) -> torch.Tensor:
    """InfoNCE with a key queue (He et al.; Contriever): positives ``k`` (B, dim) come from the
    momentum encoder (no gradient), negatives are the other keys in the batch plus the queue."""
    k = k.detach().float()
    q = q.float()
    negatives = k if queue is None or not len(queue) else torch.cat([k, queue.float()], dim=0)
    logits = q @ negatives.T / temperature
    return F.cross_entropy(logits, torch.arange(len(q), device=q.device))


@dataclass
class MatryoshkaLoss:
    """Matryoshka representation learning (Kusupati et al., 2022): ``base`` (the in-batch softmax) computed on
    each prefix of the embeddings, the first ``m`` dimensions for every ``m`` in ``dims``, and summed with
    ``weights`` (default 1 each): ``loss = Σ_i w_i · base(q[:, :m_i], d[:, :m_i], hard[:, :m_i])``. With
    ``normalize`` (cosine models) each prefix is L2-normalised again first, as ``index build --dim`` cuts and
    re-normalises the stored vectors, so that a model trained so keeps its quality when cut to any ``m_i``."""

    base: InBatchSoftmaxLoss
    dims: tuple[int, ...]
    weights: tuple[float, ...] | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        if not self.dims:
            raise ValueError("Matryoshka needs at least one prefix dimension")
        if self.weights is not None and len(self.weights) != len(self.dims):
            raise ValueError(f"{len(self.weights)} Matryoshka weights for {len(self.dims)} dimensions")

    def _cut(self, x: torch.Tensor, m: int) -> torch.Tensor:
        if m > x.shape[-1]:
            raise ValueError(f"Matryoshka dimension {m} is more than the embeddings' {x.shape[-1]}")
        part = x[..., :m]
        return F.normalize(part.float(), dim=-1) if self.normalize else part

    def __call__(
        self,
        q: torch.Tensor,
        d: torch.Tensor,
        hard: torch.Tensor | None = None,
        false_negative_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        weights = self.weights or (1.0,) * len(self.dims)
        total = q.new_zeros((), dtype=torch.float32)
        for m, w in zip(self.dims, weights):
            h = self._cut(hard, m) if hard is not None and len(hard) else None
            total = total + w * self.base(self._cut(q, m), self._cut(d, m), h, false_negative_mask=false_negative_mask)
        return total
