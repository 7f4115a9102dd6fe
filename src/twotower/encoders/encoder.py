"""One tower: a transformer backbone, pooling, an optional projection, optional L2 normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from twotower.encoders.pooling import POOLING_MODES, pool


class Projection(nn.Module):
    """GTR's fixed-size bottleneck: a linear map (no bias) to ``out_features``, optionally layer-normed."""

    def __init__(self, in_features: int, out_features: int, *, layer_norm: bool = False, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.layer_norm = nn.LayerNorm(out_features) if layer_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return self.layer_norm(x) if self.layer_norm is not None else x


# Plain attributes that twotower.encoders.inference caches on a tower (its bf16 inference copy, its compiled
# forward): derived from the weights and rebuilt on demand, so a copy or pickle of the tower leaves them out
# (a compiled module cannot be deep-copied, and a copy must not share the original's caches).
DERIVED_CACHES = ("_bf16_cache", "_compiled_forward")
PROMPT_ROLES = ("query", "document")


class TextEncoder(nn.Module):
    """Backbone → pooling → (projection) → (normalise). ``forward`` keeps the autograd graph."""

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        *,
        pooling: str = "mean",
        normalize: bool = True,
        projection: Projection | None = None,
        max_length: int = 256,
        prompts: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        unknown = set(prompts or {}) - set(PROMPT_ROLES)
        if unknown:
            raise ValueError(f"unknown prompt role(s) {sorted(unknown)}: prompts are for {', '.join(PROMPT_ROLES)}")
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling '{pooling}': choose one of {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.projection = projection
        self.max_length = max_length
        # text prefixes the model was trained with, by role (multilingual-e5: "query: " / "passage: "); saved
        # with the model (config_sentence_transformers.json) and put in front of every text by with_prompt
        self.prompts: dict[str, str] = dict(prompts or {})

    def __getstate__(self) -> dict:
        return {k: v for k, v in super().__getstate__().items() if k not in DERIVED_CACHES}

    @property
    def hidden_size(self) -> int:
        cfg = self.backbone.config
        return cfg.hidden_size if hasattr(cfg, "hidden_size") else cfg.d_model

    @property
    def dim(self) -> int:
        return self.projection.out_features if self.projection is not None else self.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        emb = pool(hidden.float(), attention_mask, self.pooling)  # sums over hundreds of tokens: fp32
        if self.projection is not None:
            emb = self.projection(emb.to(self.projection.linear.weight.dtype)).float()
        if self.normalize:
            emb = nn.functional.normalize(emb, p=2, dim=-1)
        return emb

    def with_prompt(self, texts: Sequence[str], role: str) -> list[str]:
        """``texts`` as this tower must see them in ``role`` (``query`` or ``document``): behind the model's
        prefix for that role, if it has one. Every path that turns queries or documents into token ids
        (encoding, indexing, search, serving, training) passes them through here first."""
        if role not in PROMPT_ROLES:
            raise ValueError(f"unknown prompt role '{role}': choose one of {', '.join(PROMPT_ROLES)}")
        prefix = self.prompts.get(role, "")
        return [prefix + t for t in texts] if prefix else list(texts)

    def tokenize(self, texts: list[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenize with padding to the longest text (for training batches)."""
        return self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=max_length or self.max_length,
            return_tensors="pt",
        )
