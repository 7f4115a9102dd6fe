"""What a training step optimises (:class:`Objective`), apart from the loop that runs it (``trainer.Trainer``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from twotower.data.pairs import TrainExample
from twotower.errors import TwoTowerError
from twotower.training.config import StageConfig
from twotower.training.losses import InBatchSoftmaxLoss

if TYPE_CHECKING:
    from twotower.training.trainer import Trainer


def stage_examples(stage: StageConfig) -> list[TrainExample]:
    from twotower.data.beir import BeirDataset
    from twotower.data.pairs import load_pairs, pairs_from_beir

    if stage.pairs:
        return load_pairs(stage.pairs)
    if stage.data:
        return pairs_from_beir(BeirDataset.load(stage.data, stage.split))
    raise TwoTowerError(f"stage '{stage.name}': give data (a BEIR directory) or pairs (a JSONL file)")



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

    def setup(self, trainer: "Trainer") -> None:
        pass

    def examples(self, stage: StageConfig) -> Sequence:
        return stage_examples(stage)

    def step_loss(self, trainer: "Trainer", batch: list, stage: StageConfig, loss_fn: InBatchSoftmaxLoss,
                  rng: random.Random) -> torch.Tensor:
        return trainer._step_loss(batch, stage, loss_fn, rng)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
