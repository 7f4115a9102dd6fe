"""ME-BERT training (Luan et al.): the max score over a document's first m token vectors, with
in-batch negatives, on the regular Trainer.

:class:`MultiVectorObjective` is a trainer :class:`~twotower.training.objective.Objective` for
supervised (query, positive[, negatives]) pairs. The score of query i and document j is

    s(i, j) = max_t ⟨q_i, d_j,t⟩,  t < m (real tokens only: padding never wins the max)

where ``q_i`` is the query tower's pooled vector and ``d_j,t`` are the document tower's first m
token vectors, made by :func:`twotower.retrieval.multivector.document_token_vectors` — the same
function that indexing and ``twotower eval --retriever multivector`` use, so retrieval scores are
the training scores. The loss is the stage's :class:`~twotower.training.losses.InBatchSoftmaxLoss`
(temperature, bi-directional, hard negatives in the query→document denominator, in-batch copies of
a query's positives masked out) applied to that score matrix (``from_scores``). ``m = 1`` is the
[CLS] (first-token) vector alone.

The trained m is stored on the model (``DualEncoder.multivector``, written to ``twotower.json``)
so ``twotower eval --retriever multivector`` uses it by default. Not supported: GradCache
(``cache_chunk``; the max over token vectors is not one embedding per text) and multi-process
(torchrun) training.
"""

from __future__ import annotations

import random

import torch

from twotower.data.pairs import TrainExample
from twotower.checks import flag, given
from twotower.errors import TwoTowerError
from twotower.retrieval.multivector import document_token_vectors, maxsim
from twotower.training.losses import InBatchSoftmaxLoss
from twotower.training.config import StageConfig
from twotower.training.objective import Objective, TrainingLoop


def multivector_scores(
    q: torch.Tensor,
    docs: tuple[torch.Tensor, torch.Tensor],
    hard: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, back_scores)`` for :meth:`InBatchSoftmaxLoss.from_scores`.

    ``q`` (B, dim) pooled queries; ``docs`` = (vectors (B, m, dim), mask (B, m)) of their positives;
    ``hard`` the same for extra negatives. ``scores`` (B, B + H): every query against the positives
    then the hard negatives; ``back_scores`` (B, B): positive i against every query (the transpose
    of the in-batch block).
    """
    vectors, mask = docs
    if hard is not None and len(hard[0]):
        vectors, mask = torch.cat([vectors, hard[0]]), torch.cat([mask, hard[1]])
    scores = maxsim(q, vectors, mask)
    return scores, scores[:, : len(q)].T


class MultiVectorObjective(Objective):
    """Train the ME-BERT max score over the first ``m`` document token vectors (m ≥ 1)."""

    def __init__(self, m: int) -> None:
        if m < 1:
            raise TwoTowerError(f"{given('multivector', m)}: at least 1 is needed (the number of document token "
                                "vectors)")
        self.m = m

    def setup(self, trainer: TrainingLoop) -> None:
        if trainer.world > 1:
            raise TwoTowerError(f"{flag('multivector')} training runs in one process: launch it without torchrun")
        for stage in trainer.config.stages:
            if stage.cache_chunk:
                raise TwoTowerError(f"stage '{stage.name}': gradient caching ({flag('cache_chunk')}) does not "
                                    f"support {flag('multivector')} training; drop it and lower {flag('batch_size')} "
                                    "to fit memory")
        trainer.model.multivector = self.m  # saved in twotower.json: eval's default m

    def step_loss(self, trainer: TrainingLoop, batch: list[TrainExample], stage: StageConfig,
                  loss_fn: InBatchSoftmaxLoss, rng: random.Random) -> torch.Tensor:
        model = trainer.model
        queries, positives, negatives = trainer.batch_texts(batch, stage, rng)
        fn_mask = trainer.false_negative_mask(batch)

        def documents(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return document_token_vectors(model.doc_tower, input_ids, attention_mask, self.m)

        groups = [(model.forward_queries, *trainer._tokenize(model.query_tower, queries, model.query_max_length)),
                  (documents, *trainer._tokenize(model.doc_tower, positives, model.doc_max_length))]
        if negatives:
            groups.append((documents, *trainer._tokenize(model.doc_tower, negatives, model.doc_max_length)))

        def loss_of(q, docs, hard=None):
            scores, back = multivector_scores(q, docs, hard)
            return loss_fn.from_scores(scores, back, false_negative_mask=fn_mask)

        return trainer.backward(groups, loss_of, stage, buckets=False)  # documents() returns a tuple
