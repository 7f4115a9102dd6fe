"""What a training step optimises (:class:`Objective`), apart from the loop that runs it (``trainer.Trainer``).

An objective sees the loop through :class:`TrainingLoop`, the part of the Trainer it may call: the trainer imports
this module, never the other way round."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from twotower.data.pairs import TrainExample
from twotower.encoders.towers import DualEncoder
from twotower.errors import TwoTowerError
from twotower.training.config import StageConfig, TrainConfig
from twotower.training.losses import InBatchSoftmaxLoss

log = logging.getLogger(__name__)

# pairs below which a fine-tune is warned about: SciFact's 919 judged pairs lift MiniLM's NDCG@10 by ~0.07
FEW_PAIRS = 100


def check_learnable(examples: Sequence[TrainExample], stage: StageConfig, where: str = "") -> None:
    """Refuse training data from which the in-batch softmax learns nothing, saying how much would do; warn where it
    learns little. Each query's positive is scored against the batch's other documents, and a document that is a
    positive of the same query, or the same document, is masked out of the denominator (trainer's false-negative
    mask): with one pair, one query or one document throughout, every step's loss is exactly 0. Hard negatives
    (``stage.hard_negatives``) give every query candidates of its own."""
    where = where or f"stage '{stage.name}'"
    queries = {e.qid or e.query for e in examples}
    documents = {e.pid or e.positive for e in examples}
    if not stage.hard_negatives and (len(examples) < 2 or len(queries) < 2 or len(documents) < 2):
        what = (f"{len(examples)} training pair" if len(examples) < 2 else
                f"{len(examples)} training pairs, all of one query" if len(queries) < 2 else
                f"{len(examples)} training pairs, all judged on one document")
        raise TwoTowerError(
            f"{where}: {what}: the in-batch softmax scores each query's positive against the other pairs' documents, "
            "and a copy of the same query or document is masked out, so the loss is exactly 0 and nothing is learned; "
            "give pairs of at least 2 different queries and 2 different documents (a useful fine-tune takes hundreds: "
            "SciFact's 919), or hard negatives")
    if len(examples) < stage.batch_size:
        log.warning("%s: %d training pairs, fewer than a batch (%d): every step sees the same few in-batch "
                    "negatives; a batch of %d needs at least %d pairs, and a useful fine-tune hundreds",
                    where, len(examples), stage.batch_size, stage.batch_size, stage.batch_size)
    elif len(examples) < FEW_PAIRS:
        log.warning("%s: only %d training pairs: expect little to be learned (a useful fine-tune takes hundreds, "
                    "e.g. SciFact's 919)", where, len(examples))


def stage_examples(stage: StageConfig) -> list[TrainExample]:
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import load_pairs, pairs_from_beir

    if stage.pairs:
        return load_pairs(stage.pairs)
    if stage.data:
        return pairs_from_beir(BeirDataset.load(stage.data, stage.split))
    raise TwoTowerError(f"stage '{stage.name}': give data (a BEIR directory) or pairs (a JSONL file)")


class TrainingLoop(Protocol):
    """What an :class:`Objective` may use of the loop that runs it (``twotower.training.trainer.Trainer``): the
    model, the run's settings, where it runs, and the loop's ways to turn a batch into texts, tokens, a
    false-negative mask and a backward pass."""

    config: TrainConfig
    model: DualEncoder
    device: torch.device
    world: int

    def batch_texts(self, examples: list[TrainExample], stage: StageConfig,
                    rng: random.Random) -> tuple[list[str], list[str], list[str]]: ...

    def false_negative_mask(self, examples: list[TrainExample]) -> torch.Tensor | None: ...

    def backward(self, groups, loss_of: Callable[..., torch.Tensor], stage: StageConfig, *,
                 buckets: bool = True) -> torch.Tensor: ...

    def _tokenize(self, tower, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def _autocast(self): ...

    def _step_loss(self, examples: list[TrainExample], stage: StageConfig, loss_fn,
                   rng: random.Random) -> torch.Tensor: ...


class Objective:
    """What a training step optimises; the Trainer keeps the loop, optimizer, schedule, precision,
    progress and checkpoints. This base class is supervised training on (query, positive[,
    negatives]) pairs with the in-batch softmax; others (e.g. Contriever pre-training in
    ``twotower.training.pretrain``) override:

    - :meth:`setup`, called once at the start of :meth:`Trainer.train`, before a checkpoint is loaded;
    - :meth:`examples`: the items a stage's batches index into (``batch_indices``);
    - :meth:`step_loss`: embed one batch, backpropagate (``Trainer.backward``), return the detached
      loss. ``rng`` is seeded by (seed, stage, step), so anything drawn from it is reproduced on resume;
    - :meth:`state_dict` / :meth:`load_state_dict`: extra state written with every checkpoint
      (``objective.pt``) and restored on resume.
    """

    def setup(self, trainer: TrainingLoop) -> None:
        pass

    def examples(self, stage: StageConfig) -> Sequence:
        examples = stage_examples(stage)
        check_learnable(examples, stage)
        return examples

    def step_loss(self, trainer: TrainingLoop, batch: list, stage: StageConfig, loss_fn: InBatchSoftmaxLoss,
                  rng: random.Random) -> torch.Tensor:
        return trainer._step_loss(batch, stage, loss_fn, rng)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
