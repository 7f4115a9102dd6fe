"""LangChain over twotower (``pip install 'twotower[langchain]'``): a retriever over an index
(:class:`TwoTowerRetriever`), a vector store (:class:`TwoTowerVectorStore`) and embeddings over a twotower encoder
(:class:`TwoTowerEmbeddings`).

Example::

    from twotower.integrations.langchain import TwoTowerEmbeddings, TwoTowerRetriever, TwoTowerVectorStore
"""

from __future__ import annotations

from twotower.integrations import missing_extra

try:
    import langchain_core.documents  # noqa: F401  (the framework, checked once for the whole package)
    import langchain_core.vectorstores  # noqa: F401
except ImportError as exc:
    raise missing_extra("langchain-core", "langchain", __name__, exc) from exc

from twotower.integrations.langchain.embeddings import TwoTowerEmbeddings
from twotower.integrations.langchain.retriever import ScoredDocument, TwoTowerRetriever
from twotower.integrations.langchain.vectorstore import TwoTowerVectorStore

__all__ = ["ScoredDocument", "TwoTowerEmbeddings", "TwoTowerRetriever", "TwoTowerVectorStore"]
