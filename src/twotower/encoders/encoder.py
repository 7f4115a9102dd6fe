"""One tower: a transformer backbone, pooling, an optional projection, optional L2 normalisation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from twotower.encoders.pooling import POOLING_MODES, pool


@dataclass
class TowerSpec:
    pooling: str = "mean"
    normalize: bool = True
    max_length: int = 256


class TextEncoder(nn.Module):
    """Backbone → pooling → (projection) → (normalise). ``forward`` keeps the autograd graph."""

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        *,
        pooling: str = "mean",
        normalize: bool = True,
        projection: nn.Module | None = None,
        max_length: int = 256,
    ) -> None:
        super().__init__()
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling '{pooling}': choose one of {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.projection = projection
        self.max_length = max_length

    @property
    def dim(self) -> int:
        if self.projection is not None:
            return self.projection.out_features
        return self.backbone.config.hidden_size if hasattr(self.backbone.config, "hidden_size") else self.backbone.config.d_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        emb = pool(hidden, attention_mask, self.pooling)
        if self.projection is not None:
            emb = self.projection(emb)
        if self.normalize:
            emb = nn.functional.normalize(emb.float(), p=2, dim=-1)
        return emb

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenize with padding to the longest text (for training batches)."""
        return self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=max_length or self.max_length,
            return_tensors="pt",
        )
