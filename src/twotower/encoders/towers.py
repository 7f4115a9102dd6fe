"""The dual encoder: a query tower and a document tower, shared or not.

Tower configurations (Dong et al., "Exploring Dual Encoder Architectures"; GTR uses ``sde``):

- ``sde``: one encoder and one projection for both towers;
- ``ade``: two separately parameterised encoders and projections, both initialised from one checkpoint;
- ``ade-ste``: separate encoders sharing the token embedder;
- ``ade-fte``: separate encoders with the token embedders frozen;
- ``ade-spl``: separate encoders sharing the projection layer.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from twotower.encoders.encoder import Projection, TextEncoder
from twotower.encoders.runtimes import encode_with_runtime
from twotower.encoders.io import load_tower, read_dual_config, save_dual_encoder

TOWER_KINDS = ("sde", "ade", "ade-ste", "ade-fte", "ade-spl")
SIMILARITIES = ("cosine", "dot")


@dataclass
class EncodeOptions:
    batch_size: int | None = None  # None: the device's default (inference.DEFAULT_BATCH_SIZE)
    precision: str = "auto"
    show_progress: bool = True
    compile: bool = False  # torch.compile the forward pass (pays off on thousands of texts; see inference.py)
    runtime: str | None = None  # auto | torch | onnx | openvino | (onnx|openvino)-int8; None: runtimes.current_runtime()
    unit: str = "text"  # what the progress bar counts ("passage" for a split corpus)


def new_projection(in_features: int, out_features: int, *, layer_norm: bool = False) -> Projection:
    """A bottleneck that starts close to the backbone's own geometry: identity when the sizes match,
    otherwise a semi-orthogonal map (a random rotation then truncation), which keeps angles
    approximately (Johnson–Lindenstrauss) so training starts from the pretrained similarity."""
    proj = Projection(in_features, out_features, layer_norm=layer_norm)
    with torch.no_grad():
        if in_features == out_features:
            proj.linear.weight.copy_(torch.eye(out_features))
        else:
            nn.init.orthogonal_(proj.linear.weight)
            if out_features < in_features:
                proj.linear.weight.mul_((in_features / out_features) ** 0.5)
    return proj


def tie_towers(query: TextEncoder, doc: TextEncoder, kind: str) -> None:
    """Make ``doc`` share (or freeze) what ``kind`` says it shares with ``query``."""
    if kind == "ade-ste":
        doc.backbone.set_input_embeddings(query.backbone.get_input_embeddings())
    elif kind == "ade-fte":
        for tower in (query, doc):
            tower.backbone.get_input_embeddings().weight.requires_grad_(False)
    elif kind == "ade-spl":
        if query.projection is None:
            raise ValueError("ade-spl shares the projection layer: the towers need one (pass dim)")
        doc.projection = query.projection


class DualEncoder(nn.Module):
    def __init__(
        self,
        query_tower: TextEncoder,
        doc_tower: TextEncoder,
        *,
        kind: str = "sde",
        name: str = "",
        query_max_length: int | None = None,
        doc_max_length: int | None = None,
        multivector: int | None = None,
    ) -> None:
        super().__init__()
        if kind not in TOWER_KINDS:
            raise ValueError(f"unknown towers '{kind}': choose one of {', '.join(TOWER_KINDS)}")
        if (kind == "sde") != (query_tower is doc_tower):
            raise ValueError("sde means one shared tower; the ade variants need two tower objects")
        self.query_tower = query_tower
        self.doc_tower = doc_tower
        self.kind = kind
        self.name = name
        from twotower.encoders.io import clamp_length, max_positions

        # the document's first: a shared tower loaded with a document length carries it as its own default
        self.doc_max_length = clamp_length(doc_max_length or doc_tower.max_length, max_positions(doc_tower.backbone),
                                           name, tower=doc_tower, role="document")
        self.query_max_length = clamp_length(query_max_length or query_tower.max_length,
                                             max_positions(query_tower.backbone), name, tower=query_tower, role="query")
        # ME-BERT m the model was trained with (twotower train --multivector); saved in twotower.json
        self.multivector = multivector

    @property
    def shared(self) -> bool:
        return self.query_tower is self.doc_tower

    @property
    def similarity(self) -> str:
        return "cosine" if self.query_tower.normalize else "dot"

    @property
    def dim(self) -> int:
        return self.query_tower.dim

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (both towers are kept on one device)."""
        from twotower.encoders.device import device_of

        return device_of(self.query_tower)

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
        """Load a model for use: a twotower directory (either tower layout), or any Hugging Face
        or sentence-transformers directory as one shared tower, or the default model.

        Pooling, normalisation, projection and max length come from the directory; explicit
        arguments override them.
        """
        name = str(model) if model else "all-MiniLM-L6-v2"
        config = read_dual_config(model)
        if config is None:  # any HF / sentence-transformers directory: one shared tower
            tower = load_tower(model, pooling=pooling, normalize=normalize, max_length=doc_max_length)
            dual = cls(tower, tower, name=name, query_max_length=query_max_length or tower.max_length)
            return dual.to(device)
        kind, root, multivector = config["towers"], Path(str(model)), config.get("multivector")
        q_len = query_max_length or config.get("query_max_length")
        d_len = doc_max_length or config.get("doc_max_length")
        if kind == "sde":
            tower = load_tower(root, pooling=pooling, normalize=normalize, max_length=d_len)
            dual = cls(tower, tower, kind="sde", name=name, query_max_length=q_len, multivector=multivector)
        else:
            query = load_tower(root / "query", pooling=pooling, normalize=normalize, max_length=q_len)
            doc = load_tower(root / "document", pooling=pooling, normalize=normalize, max_length=d_len)
            tie_towers(query, doc, kind)
            dual = cls(query, doc, kind=kind, name=name, query_max_length=q_len, doc_max_length=d_len,
                       multivector=multivector)
        return dual.to(device)

    @classmethod
    def build(
        cls,
        model: str | Path | None = None,
        *,
        towers: str = "sde",
        dim: int | None = None,
        layer_norm: bool = False,
        similarity: str = "cosine",
        pooling: str | None = None,
        query_max_length: int | None = None,
        doc_max_length: int | None = None,
    ) -> "DualEncoder":
        """Start a new dual encoder for training from a (shared) checkpoint.

        ``dim`` adds a projection to a fixed bottleneck (GTR); ``ade-spl`` without ``dim`` gets an
        identity-initialised projection of the backbone's size so that there is a layer to share.
        """
        if towers not in TOWER_KINDS:
            raise ValueError(f"unknown towers '{towers}': choose one of {', '.join(TOWER_KINDS)}")
        if similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity '{similarity}': choose one of {', '.join(SIMILARITIES)}")
        query = load_tower(model, pooling=pooling, normalize=similarity == "cosine", max_length=doc_max_length)
        if dim is not None or (towers == "ade-spl" and query.projection is None):
            query.projection = new_projection(query.hidden_size, dim or query.hidden_size, layer_norm=layer_norm)
        name = str(model) if model else "all-MiniLM-L6-v2"
        if towers == "sde":
            return cls(query, query, kind="sde", name=name, query_max_length=query_max_length)
        doc = copy.deepcopy(query)
        tie_towers(query, doc, towers)
        return cls(query, doc, kind=towers, name=name, query_max_length=query_max_length)

    def save(self, path: str | Path) -> None:
        """Write the model to ``path`` atomically, as ``twotower.json`` + sentence-transformers tower(s)."""
        save_dual_encoder(self, path)

    def forward_queries(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.query_tower(input_ids, attention_mask)

    def forward_documents(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.doc_tower(input_ids, attention_mask)

    @property
    def prompts(self) -> dict[str, str]:
        """The prefixes put in front of queries and documents (empty for models trained without any)."""
        out = {}
        if "query" in self.query_tower.prompts:
            out["query"] = self.query_tower.prompts["query"]
        if "document" in self.doc_tower.prompts:
            out["document"] = self.doc_tower.prompts["document"]
        return out

    def query_texts(self, queries: Sequence[str]) -> list[str]:
        """Queries as the query tower must see them (behind the model's query prefix, if any)."""
        return self.query_tower.with_prompt(queries, "query")

    def document_texts(self, docs: Sequence[str]) -> list[str]:
        """Documents as the document tower must see them (behind the model's document prefix, if any)."""
        return self.doc_tower.with_prompt(docs, "document")

    def with_prompts(self, queries: Sequence[str], *documents: Sequence[str]) -> tuple[list[str], ...]:
        """A training batch's queries and document lists (positives, negatives, …), each behind its prefix."""
        return (self.query_texts(queries), *(self.document_texts(d) for d in documents))

    def encode_queries(self, queries: Sequence[str], opts: EncodeOptions | None = None) -> np.ndarray:
        opts = opts or EncodeOptions()
        return encode_with_runtime(
            self.query_tower, self.query_texts(queries), max_length=self.query_max_length,
            batch_size=opts.batch_size, precision=opts.precision, show_progress=opts.show_progress,
            compile=opts.compile, runtime=opts.runtime,
            desc="encoding queries",
        )

    def encode_documents(self, docs: Sequence[str], opts: EncodeOptions | None = None) -> np.ndarray:
        opts = opts or EncodeOptions()
        return encode_with_runtime(
            self.doc_tower, self.document_texts(docs), max_length=self.doc_max_length,
            batch_size=opts.batch_size, precision=opts.precision, show_progress=opts.show_progress,
            compile=opts.compile, runtime=opts.runtime,
            desc="encoding documents", unit=opts.unit,
        )
