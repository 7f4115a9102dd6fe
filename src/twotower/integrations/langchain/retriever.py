"""A LangChain retriever over a :class:`twotower.Index` (``pip install 'twotower[langchain]'``)."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import model_validator

from twotower.errors import TwoTowerError

from twotower.integrations.search import as_index, call_options, check_filter, check_passages, \
    check_whole_documents, hit_metadata, hit_passages, joined_text, passage_metadata, search, search_options

__all__ = ["ScoredDocument", "TwoTowerRetriever"]

_OPTIONS = ("mode", "lam", "norm", "prf_depth", "prf_weight", "rerank", "rerank_depth", "ef_search", "nprobe")
# what search_kwargs and invoke(query, **kwargs) may set: k, the filter and every search option
_PER_CALL = ("k", "filter", *_OPTIONS)


class ScoredDocument(Document):
    """A LangChain ``Document`` with the search's ``score`` in a field of its own (higher is better), so that its
    ``metadata`` stays the document's metadata exactly as it was given.

    Example::

        doc = ScoredDocument(page_content="Green tea is steamed.", id="d1", metadata={"id": 7}, score=0.83)
        print(doc.id, doc.score, doc.metadata)
    """

    score: float
    passages: list[dict] = []  # the passage(s) shown: {"text", "start", "end", "score"} (score: the passage's own)


class TwoTowerRetriever(BaseRetriever):
    """A LangChain retriever returning :meth:`twotower.Index.search`'s top ``k`` as LangChain ``Document`` objects,
    best first.

    ``index``: a :class:`twotower.Index` or the path of an index directory. ``k`` (default 10) and the other
    fields are :meth:`~twotower.Index.search`'s options (``mode``, ``lam``, ``norm``, ``prf_depth``,
    ``prf_weight``, ``rerank``, ``rerank_depth``, ``ef_search``, ``nprobe``); left out, a search uses the model's
    fitted mode, else dense. ``filter``: a metadata filter (``{"field": value}``, ``$eq $ne $gt $gte $lt $lte $in
    $nin $exists``, ``$and`` / ``$or``, dotted paths: :func:`twotower.parse_filter`): only the documents it lets
    through are searched. ``search_kwargs``: LangChain's vector-store-retriever shape, a dict of any of ``k``,
    ``filter`` and the options above (``search_kwargs={"filter": {"source": "wiki"}, "k": 3}``); an option given
    both there and as an argument must agree. They are checked against the index when the retriever is made, and a
    re-ranker given as a directory is loaded then, once.

    Per call, ``invoke(query, k=..., filter=..., mode=...)`` (and ``ainvoke``) override the retriever's own values
    for that call (a filter given there replaces the retriever's, as in LangChain's vector-store retrievers); they
    are checked as the constructor checks them.

    Each hit is a :class:`ScoredDocument` (a LangChain ``Document``) with ``id`` = the document's id and ``score``
    = its score (exactly :meth:`~twotower.Index.search`'s). By default its ``page_content`` is the document's best
    passage for the query (``text[start:end]`` of the document's text: what a RAG prompt needs, not the whole
    document), and its ``metadata`` the document's metadata as it was given plus one key, ``"passage"``:
    ``{"document_id", "title", "start", "end", "score", "passage_score"}`` (``start`` / ``end``: code-point offsets
    into the document's text; ``"page"`` too when the passage has one; a document whose metadata already holds
    ``"passage"`` is refused, by name). ``passages=N``: each hit's N best passages, one :class:`ScoredDocument`
    each, hit by hit, best first (each with the document's score; the passage's own is ``passage_score``).
    ``whole_documents=True``: one :class:`ScoredDocument` per hit with ``page_content`` = title and text joined as
    twotower joins them for its encoder (``"title text"``; the text alone when there is no title) and ``metadata``
    = the document's metadata exactly as it was given (:attr:`twotower.Hit.metadata`: nothing added, removed or
    renamed); its ``passages`` hold the hit's N best passages (``{"text", "start", "end", "score"}``).
    ``ainvoke`` runs the search in a worker thread, so the event loop keeps running; searches of one index run one
    at a time (its tokenizer is not thread-safe).

    Example::

        import twotower as tt
        from twotower.integrations.langchain import TwoTowerRetriever

        index = tt.Index.build("tea-index", [{"_id": "d1", "text": "Green tea is steamed.", "type": "tea"},
                                             {"_id": "d2", "text": "Coffee is roasted.", "type": "coffee"}], bm25=True)
        retriever = TwoTowerRetriever(index, k=1, mode="hybrid", lam=0.6)  # or TwoTowerRetriever("tea-index")
        docs = retriever.invoke("green tea")           # await retriever.ainvoke("green tea") in async code
        print(docs[0].id, docs[0].score, docs[0].metadata["type"], docs[0].page_content)
        print(docs[0].metadata["passage"]["start"], docs[0].metadata["passage"]["end"])  # its place in the text
        whole = TwoTowerRetriever(index, k=1, whole_documents=True).invoke("green tea")  # whole documents
        coffee = retriever.invoke("a hot drink", k=2, filter={"type": "coffee"})  # per call: k, filter, mode ...
        teas = TwoTowerRetriever(index, search_kwargs={"k": 2, "filter": {"type": {"$in": ["tea"]}}})
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
    filter: Any = None
    search_kwargs: dict = {}
    passages: int = 1
    whole_documents: bool = False

    def __init__(self, index: Any = None, /, k: int = 10, *, mode: str | None = None, lam: float | None = None,
                 norm: str | None = None, prf_depth: int | None = None, prf_weight: float | None = None,
                 rerank: Any = None, rerank_depth: int | None = None, ef_search: int | None = None,
                 nprobe: int | None = None, filter: Any = None, search_kwargs: dict | None = None,
                 passages: int = 1, whole_documents: bool = False, **fields: Any) -> None:
        """``fields``: LangChain's own (``name``, ``tags``, ``metadata``), or ``index=`` by keyword."""
        if index is not None:
            fields["index"] = index
        super().__init__(k=k, mode=mode, lam=lam, norm=norm, prf_depth=prf_depth, prf_weight=prf_weight,
                         rerank=rerank, rerank_depth=rerank_depth, ef_search=ef_search, nprobe=nprobe, filter=filter,
                         search_kwargs={} if search_kwargs is None else search_kwargs, passages=passages,
                         whole_documents=whole_documents, **fields)

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
        given = {name: data.get(name) for name in _PER_CALL}
        given["k"] = data.get("k", cls.model_fields["k"].default)
        extra = call_options(data.get("search_kwargs") or {}, _PER_CALL, "search_kwargs")
        for name, value in extra.items():
            default = cls.model_fields["k"].default if name == "k" else None
            if given[name] != default and given[name] != value:
                raise TwoTowerError(f"{name} is given twice, as {name}={given[name]!r} and in search_kwargs as "
                                    f"{value!r}: give it once")
            given[name] = value
        k, flt = given.pop("k"), check_filter(given.pop("filter"))
        passages = check_passages(data.get("passages", 1))
        whole = check_whole_documents(data.get("whole_documents", False))
        options = search_options(index, k, **given)
        return {**data, "index": index, "k": k, "filter": flt, "passages": passages, "whole_documents": whole,
                **options}  # a re-ranker directory: loaded

    def _documents(self, query: str, kwargs: dict) -> list[ScoredDocument]:
        options = {name: getattr(self, name) for name in _OPTIONS}
        k, flt = self.k, self.filter
        if kwargs:
            call = call_options(kwargs, _PER_CALL, "invoke")
            k, flt = call.pop("k", k), check_filter(call.pop("filter")) if "filter" in call else flt
            options = search_options(self.index, k, **{**options, **call})
        hits = search(self.index, query, k, {**options, "filter": flt, "passages": self.passages})
        if self.whole_documents:
            return [ScoredDocument(page_content=joined_text(hit), id=hit.id, metadata=hit_metadata(hit),
                                   score=hit.score, passages=[p.to_dict() for p in hit_passages(hit)]) for hit in hits]
        return [ScoredDocument(page_content=p.text, id=hit.id, score=hit.score, passages=[p.to_dict()],
                               metadata=passage_metadata(hit.id, hit.title, hit.score, p, hit.metadata))
                for hit in hits for p in hit_passages(hit)]  # each hit's passages, best first, hit by hit

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        return self._documents(query, kwargs)

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        return await asyncio.to_thread(self._documents, query, kwargs)
