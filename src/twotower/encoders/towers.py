"""The dual encoder: a query tower and a document tower.

With shared towers (GTR's SDE) both attributes point at the same :class:`TextEncoder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from twotower.encoders.backbone import load_backbone, read_layout, resolve_model
from twotower.encoders.encoder import TextEncoder
from twotower.encoders.inference import encode_texts


@dataclass
class EncodeOptions:
    batch_size: int = 32
    precision: str = "auto"
    show_progress: bool = True


class DualEncoder(nn.Module):
    def __init__(
        self,
        query_tower: TextEncoder,
        doc_tower: TextEncoder,
        *,
        name: str = "",
        query_max_length: int | None = None,
        doc_max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.query_tower = query_tower
        self.doc_tower = doc_tower
        self.name = name
        self.query_max_length = query_max_length or query_tower.max_length
        self.doc_max_length = doc_max_length or doc_tower.max_length

    @property
    def shared(self) -> bool:
        return self.query_tower is self.doc_tower

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
        query_max_length: int | None = None,
        doc_max_length: int | None = None,
        device: str | torch.device = "cpu",
    ) -> "DualEncoder":
        """Load a shared-tower encoder from a HF or sentence-transformers directory (or the default).

        Pooling, normalisation and max length come from the directory's sentence-transformers
        config when present; explicit arguments override it; otherwise mean pooling, L2
        normalisation and 512 tokens.
        """
        resolved = resolve_model(model)
        layout = read_layout(resolved)
        tokenizer, backbone = load_backbone(layout.transformer_dir)
        max_len = layout.max_length or min(512, getattr(tokenizer, "model_max_length", 512) or 512)
        tower = TextEncoder(
            backbone,
            tokenizer,
            pooling=pooling or layout.pooling or "mean",
            normalize=normalize if normalize is not None else (layout.normalize if layout.normalize is not None else True),
            max_length=doc_max_length or max_len,
        )
        name = str(model) if model else "all-MiniLM-L6-v2"
        return cls(tower, tower, name=name, query_max_length=query_max_length or max_len).to(device)

    def encode_queries(self, queries: Sequence[str], opts: EncodeOptions | None = None) -> np.ndarray:
        opts = opts or EncodeOptions()
        return encode_texts(
            self.query_tower, queries, max_length=self.query_max_length,
            batch_size=opts.batch_size, precision=opts.precision, show_progress=opts.show_progress,
            desc="encoding queries",
        )

    def encode_documents(self, docs: Sequence[str], opts: EncodeOptions | None = None) -> np.ndarray:
        opts = opts or EncodeOptions()
        return encode_texts(
            self.doc_tower, docs, max_length=self.doc_max_length,
            batch_size=opts.batch_size, precision=opts.precision, show_progress=opts.show_progress,
            desc="encoding documents",
        )
