"""A LlamaIndex embedding model over a twotower encoder: its query tower for queries, its document tower for texts,
each with the model's own prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import PrivateAttr

from twotower.errors import TwoTowerError

__all__ = ["TwoTowerEmbedding"]


class TwoTowerEmbedding(BaseEmbedding):
    """A LlamaIndex ``BaseEmbedding`` over :class:`twotower.Encoder`: queries through the query tower, texts (nodes)
    through the document tower, each with the model's prompt (:attr:`twotower.Encoder.prompts`).

    ``encoder``: an :class:`~twotower.Encoder`, a model name or directory (None: all-MiniLM-L6-v2, loaded on first
    use); ``device``, ``precision`` as :meth:`twotower.Encoder.load` takes them; ``embed_batch_size`` and the other
    fields are LlamaIndex's.

    Example::

        from twotower.integrations.llama_index import TwoTowerEmbedding

        emb = TwoTowerEmbedding("all-MiniLM-L6-v2", device="cpu")
        q = emb.get_query_embedding("how is green tea made")
        docs = emb.get_text_embedding_batch(["Green tea leaves are steamed.", "Coffee is roasted."])
        print(len(q), len(docs))
    """

    _encoder: Any = PrivateAttr(default=None)
    _given: Any = PrivateAttr(default=None)
    _options: dict = PrivateAttr(default_factory=dict)

    def __init__(self, encoder=None, *, device: str = "auto", precision: str = "auto", **fields: Any) -> None:
        from twotower.api.encoder import Encoder

        if encoder is not None and not isinstance(encoder, (Encoder, str, Path)):
            raise TwoTowerError(f"encoder: give a twotower.Encoder, a model name or a directory, not "
                                f"{type(encoder).__name__}")
        name = encoder.name if isinstance(encoder, Encoder) else str(encoder or "all-MiniLM-L6-v2")
        super().__init__(model_name=fields.pop("model_name", name), **fields)
        self._given = encoder
        self._options = {"device": device, "precision": precision}
        self._encoder = encoder if isinstance(encoder, Encoder) else None

    @classmethod
    def class_name(cls) -> str:
        return "TwoTowerEmbedding"

    @property
    def encoder(self):
        """The :class:`twotower.Encoder` (loaded on first use)."""
        if self._encoder is None:
            from twotower.api.encoder import Encoder

            self._encoder = Encoder.load(self._given, **self._options)
        return self._encoder

    def _get_query_embedding(self, query: str) -> list[float]:
        return self.encoder.encode_queries([query])[0].astype(float).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self.encoder.encode_documents(list(texts)).astype(float).tolist() if texts else []

    async def _aget_query_embedding(self, query: str) -> list[float]:
        import asyncio

        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        import asyncio

        return await asyncio.to_thread(self._get_text_embedding, text)
