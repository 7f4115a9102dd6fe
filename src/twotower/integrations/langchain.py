"""A LangChain retriever over a :class:`twotower.Index` (``pip install 'twotower[langchain]'``)."""

from __future__ import annotations

import asyncio
from typing import Any

from twotower.errors import TwoTowerError
from twotower.integrations import missing_extra

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import model_validator
except ImportError as exc:
    raise missing_extra("langchain-core", "langchain", __name__, exc) from exc

from twotower.integrations.search import as_index, joined_text, search, search_options

__all__ = ["TwoTowerRetriever"]

_OPTIONS = ("mode", "lam", "norm", "prf_depth", "prf_weight", "rerank", "rerank_depth", "ef_search", "nprobe")


class TwoTowerRetriever(BaseRetriever):
    """A LangChain retriever returning :meth:`twotower.Index.search`'s top ``k`` as LangChain ``Document`` objects,
    best first.

    ``index``: a :class:`twotower.Index` or the path of an index directory. ``k`` (default 10) and the other
    fields are :meth:`~twotower.Index.search`'s options (``mode``, ``lam``, ``norm``, ``prf_depth``,
    ``prf_weight``, ``rerank``, ``rerank_depth``, ``ef_search``, ``nprobe``); left out, a search uses the model's
    fitted mode, else dense. They are checked against the index when the retriever is made, and a re-ranker given
    as a directory is loaded then, once.

    Each ``Document`` has ``id`` = the document's id, ``page_content`` = title and text joined as twotower joins
    them for its encoder (``"title text"``; the text alone when there is no title) and ``metadata``
    ``{"id", "score", "title"}``. ``ainvoke`` runs the search in a worker thread, so the event loop keeps running;
    searches of one index run one at a time (its tokenizer is not thread-safe).

    Example::

        import twotower as tt
        from twotower.integrations.langchain import TwoTowerRetriever

        index = tt.Index.build("tea-index", {"d1": "Green tea is steamed.", "d2": "Coffee is roasted."}, bm25=True)
        retriever = TwoTowerRetriever(index, k=1, mode="hybrid", lam=0.6)  # or TwoTowerRetriever("tea-index")
        docs = retriever.invoke("green tea")           # await retriever.ainvoke("green tea") in async code
        print(docs[0].metadata["id"], docs[0].metadata["score"], docs[0].page_content)
    """

    index: Any
    k: int = 10
    mode: str | None = None
    lam: float | None = None
    norm: str | None = None
    prf_depth: int | None = None
    prf_weight: float | None = None
    rerank: Any = None
    rerank_depth: int | None = None
    ef_search: int | None = None
    nprobe: int | None = None

    def __init__(self, index: Any = None, /, k: int = 10, *, mode: str | None = None, lam: float | None = None,
                 norm: str | None = None, prf_depth: int | None = None, prf_weight: float | None = None,
                 rerank: Any = None, rerank_depth: int | None = None, ef_search: int | None = None,
                 nprobe: int | None = None, **fields: Any) -> None:
        """``fields``: LangChain's own (``name``, ``tags``, ``metadata``), or ``index=`` by keyword."""
        if index is not None:
            fields["index"] = index
        super().__init__(k=k, mode=mode, lam=lam, norm=norm, prf_depth=prf_depth, prf_weight=prf_weight,
                         rerank=rerank, rerank_depth=rerank_depth, ef_search=ef_search, nprobe=nprobe, **fields)

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        """Open the index and check the options as given (each error a TwoTowerError naming the option)."""
        if not isinstance(data, dict):
            return data
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise TwoTowerError(f"TwoTowerRetriever: unknown option(s) {', '.join(unknown)}; it takes "
                                f"{', '.join(cls.model_fields)}")
        if data.get("index") is None:
            raise TwoTowerError("index: give a twotower.Index or the path of an index directory")
        index = as_index(data["index"])
        k = data.get("k", cls.model_fields["k"].default)
        options = search_options(index, k, **{name: data.get(name) for name in _OPTIONS})
        return {**data, "index": index, **options}  # a re-ranker directory becomes the loaded re-ranker

    def _documents(self, query: str) -> list[Document]:
        options = {name: getattr(self, name) for name in _OPTIONS}
        return [Document(page_content=joined_text(hit), id=hit.id,
                         metadata={"id": hit.id, "score": hit.score, "title": hit.title})
                for hit in search(self.index, query, self.k, options)]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(query)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return await asyncio.to_thread(self._documents, query)
