"""Length buckets for a training step: pad each group of similar-length texts, not the whole batch.

A tokenized batch is padded to its longest text, so with SciFact abstracts (mean ~150 of at most
256 tokens) a third of the document tokens the encoder runs on are padding. Sorting a group by
length, cutting it into buckets of ``size`` texts and trimming each bucket to its own longest
member removes most of that work; the embeddings are put back in the batch's order, so the loss
and its gradients are those of the padded batch (to float rounding: the attention mask already
hides padding). Only dropout draws differ, as with any other change in tensor shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EmbedFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def length_buckets(mask: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row indices sorted by real length (longest first), cut into buckets of ``size`` rows."""
    order = torch.argsort(mask.sum(dim=1), descending=True, stable=True)
    return [order[i : i + size] for i in range(0, len(order), size)]


def embed_in_buckets(fn: EmbedFn, ids: torch.Tensor, mask: torch.Tensor, size: int | None) -> torch.Tensor:
    """``fn(ids, mask)`` computed bucket by bucket (see the module doc), rows in the input order.

    ``size`` None or 0, or a batch no larger than one bucket, runs ``fn`` once on the whole batch.
    Left-padded batches (padding at the start of a row) are embedded whole, as trimming needs the
    padding on the right.
    """
    if not size or len(ids) <= size:
        return fn(ids, mask)
    lengths = mask.sum(dim=1)
    right_padded = (mask != 0) == (torch.arange(mask.shape[1], device=mask.device) < lengths[:, None])
    if not bool(right_padded.all()):
        return fn(ids, mask)
    buckets = length_buckets(mask, size)
    parts = []
    for rows in buckets:
        width = int(lengths[rows].max())
        parts.append(fn(ids[rows, :width], mask[rows, :width]))
    order = torch.cat(buckets)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(parts)[inverse]


def embed_together(fn: EmbedFn, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """``[fn(ids, mask) for ids, mask in parts]`` in one call: each right-padded batch padded further to the widest,
    all stacked, embedded once and split back. For groups that one tower embeds (a step's queries, positives and
    negatives under shared towers) on a GPU, where a small model's step is bound by kernel launches and Python, not
    by the padding's arithmetic: one forward and one backward pass instead of one per group."""
    width = max(ids.shape[1] for ids, _ in parts)
    ids = torch.cat([torch.nn.functional.pad(i, (0, width - i.shape[1])) for i, _ in parts])
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for _, m in parts])
    return list(fn(ids, mask).split([len(i) for i, _ in parts]))
