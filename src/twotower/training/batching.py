"""A stage's batches: how many steps it runs, which examples each process's share of each global batch holds, and
which in-batch documents are a query's own positives (false negatives, left out of its softmax).

The order is a pure function of (seed, stage, step): a resumed run draws exactly the batches an uninterrupted one
would, and under ``torchrun`` every process computes the same global batch and takes every ``world``-th example.

Example::

    total, per_epoch = steps_for(stage, len(examples), world=1)
    batch = [examples[i] for i in batch_indices(seed, 0, step, len(examples), stage.batch_size, rank=0, world=1)]
    mask = false_negative_mask(batch, device)  # for InBatchSoftmaxLoss(false_negative_mask=...)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from twotower.data.pairs import TrainExample
from twotower.training.config import StageConfig


def steps_for(stage: StageConfig, n_examples: int, world: int) -> tuple[int, int]:
    """(total steps, steps per epoch) of a stage."""
    per_epoch = math.ceil(n_examples / (stage.batch_size * world))
    if stage.steps:
        return stage.steps, per_epoch
    return max(1, round((stage.epochs or 1.0) * per_epoch)), per_epoch


def batch_indices(seed: int, stage_idx: int, step: int, n: int, batch_size: int, rank: int, world: int) -> np.ndarray:
    """Example indices of this process's share of global batch ``step``: a pure function of its
    arguments, which is what makes resuming reproduce the data order."""
    global_bs = batch_size * world
    per_epoch = math.ceil(n / global_bs)
    epoch, pos = divmod(step, per_epoch)
    order = np.random.default_rng([seed, stage_idx, epoch]).permutation(n)
    batch = order[pos * global_bs : (pos + 1) * global_bs]
    if world > 1 and len(batch) < global_bs:  # equal shares for the all-gather: wrap around (as DistributedSampler)
        batch = np.concatenate([batch, np.resize(order, global_bs - len(batch))])
    return batch[rank::world]


def false_negative_mask(examples: list[TrainExample], device: torch.device | str = "cpu") -> torch.Tensor:
    """True where in-batch document j is (a copy of) a positive of query i, j ≠ i; on ``device`` (the model's:
    the loss combines it with the scores)."""
    def codes(keys: list[str]) -> torch.Tensor:
        index: dict[str, int] = {}
        return torch.tensor([index.setdefault(k, len(index)) for k in keys])

    q = codes([e.qid or e.query for e in examples])
    p = codes([e.pid or e.positive for e in examples])
    mask = (q[:, None] == q[None, :]) | (p[:, None] == p[None, :])
    mask.fill_diagonal_(False)
    if torch.device(device).type == "cuda":  # from page-locked memory the copy is asynchronous: no wait on the GPU
        mask = mask.pin_memory()
    return mask.to(device, non_blocking=True)
