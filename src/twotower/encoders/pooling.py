"""Pool token vectors into one vector per text."""

from __future__ import annotations

import torch

POOLING_MODES = ("mean", "cls", "max")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pool ``hidden`` (batch, tokens, dim) under ``attention_mask`` (batch, tokens).

    ``mean`` averages the non-padding tokens (GTR's choice), ``cls`` takes the first token,
    ``max`` takes the element-wise maximum over non-padding tokens.
    """
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        return summed / mask.sum(dim=1).clamp(min=1e-9)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        masked = hidden.masked_fill(attention_mask.unsqueeze(-1) == 0, torch.finfo(hidden.dtype).min)
        return masked.max(dim=1).values
    raise ValueError(f"unknown pooling '{mode}': choose one of {', '.join(POOLING_MODES)}")
