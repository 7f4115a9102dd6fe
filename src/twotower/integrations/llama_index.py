"""A LlamaIndex retriever over a :class:`twotower.Index` (``pip install 'twotower[llama-index]'``)."""

from __future__ import annotations

import asyncio
from typing import Any

from twotower.integrations import missing_extra

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:
    raise missing_extra("llama-index-core", "llama-index", __name__, exc) from exc

from twotower.api.index import Hit
from twotower.integrations.search import as_index, search, search_options

__all__ = ["TwoTowerRetriever"]

# shown to neither the LLM nor an embedding model when LlamaIndex renders a node's content with its metadata
_HIDDEN = ["id", "score"]


class TwoTowerRetriever(BaseRetriever):
    """A LlamaIndex retriever returning :meth:`twotower.Index.search`'s top ``k`` as ``NodeWithScore`` objects
    holding ``TextNode`` objects, best first.

    ``index``: a :class:`twotower.Index` or the path of an index directory. ``k`` (default 10) and the keyword
    options are :meth:`~twotower.Index.search`'s (``mode``, ``lam``, ``norm``, ``prf_depth``, ``prf_weight``,
    ``rerank``, ``rerank_depth``, ``ef_search``, ``nprobe``); left out, a search uses the model's fitted mode, else
    dense. They are checked against the index here, and a re-ranker given as a directory is loaded here, once.
    ``callback_manager`` and ``verbose`` go to LlamaIndex's ``BaseRetriever``.

    Each node has ``id_`` = the document's id, ``text`` = the document's text and ``metadata``
    ``{"id", "title", "score"}``; LlamaIndex shows the title (not the id or score) with the text when it renders the
    node for an LLM. The query is the bundle's ``query_str`` (twotower encodes it; a bundle's own embedding is not
    used). ``aretrieve`` runs the search in a worker thread, so the event loop keeps running; searches of one index
    run one at a time (its tokenizer is not thread-safe).

    Example::

        import twotower as tt
        from twotower.integrations.llama_index import TwoTowerRetriever

        index = tt.Index.build("tea-index", {"d1": "Green tea is steamed.", "d2": "Coffee is roasted."}, bm25=True)
        retriever = TwoTowerRetriever(index, k=1, mode="bm25")  # or TwoTowerRetriever("tea-index")
        nodes = retriever.retrieve("green tea")        # await retriever.aretrieve("green tea") in async code
        print(nodes[0].node.id_, nodes[0].score, nodes[0].node.text)
    """

    def __init__(self, index: Any, k: int = 10, *, mode: str | None = None, lam: float | None = None,
                 norm: str | None = None, prf_depth: int | None = None, prf_weight: float | None = None,
                 rerank: Any = None, rerank_depth: int | None = None, ef_search: int | None = None,
                 nprobe: int | None = None, callback_manager: CallbackManager | None = None,
                 verbose: bool = False, **unknown: Any) -> None:
        if unknown:  # a misspelt option (ef_serach=) is named here, as LangChain's retriever names it
            from twotower.errors import TwoTowerError

            raise TwoTowerError(f"TwoTowerRetriever: unknown option(s) {', '.join(sorted(unknown))}; it takes k, "
                                "mode, lam, norm, prf_depth, prf_weight, rerank, rerank_depth, ef_search, nprobe, "
                                "callback_manager, verbose")
        self.index = as_index(index)
        self.k = k
        self.options = search_options(self.index, k, mode=mode, lam=lam, norm=norm, prf_depth=prf_depth,
                                      prf_weight=prf_weight, rerank=rerank, rerank_depth=rerank_depth,
                                      ef_search=ef_search, nprobe=nprobe)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @staticmethod
    def _node(hit: Hit) -> NodeWithScore:
        node = TextNode(id_=hit.id, text=hit.text, metadata={"id": hit.id, "title": hit.title, "score": hit.score},
                        excluded_llm_metadata_keys=list(_HIDDEN), excluded_embed_metadata_keys=list(_HIDDEN))
        return NodeWithScore(node=node, score=hit.score)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [self._node(hit) for hit in search(self.index, query_bundle.query_str, self.k, self.options)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
