"""LlamaIndex over twotower (``pip install 'twotower[llama-index]'``): a retriever over an index
(:class:`TwoTowerRetriever`), a vector store (:class:`TwoTowerVectorStore`, a ``BasePydanticVectorStore``) and an
embedding model over a twotower encoder (:class:`TwoTowerEmbedding`, a ``BaseEmbedding``).

Example::

    from twotower.integrations.llama_index import TwoTowerEmbedding, TwoTowerRetriever, TwoTowerVectorStore
"""

from __future__ import annotations

from twotower.integrations import missing_extra

try:
    import llama_index.core.schema  # noqa: F401  (the framework, checked once for the whole package)
    import llama_index.core.vector_stores.types  # noqa: F401
except ImportError as exc:
    raise missing_extra("llama-index-core", "llama-index", __name__, exc) from exc

from twotower.integrations.llama_index.embedding import TwoTowerEmbedding
from twotower.integrations.llama_index.retriever import TwoTowerRetriever, to_twotower_filter
from twotower.integrations.llama_index.vectorstore import TwoTowerVectorStore

__all__ = ["TwoTowerEmbedding", "TwoTowerRetriever", "TwoTowerVectorStore", "to_twotower_filter"]
