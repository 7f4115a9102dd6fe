"""A LlamaIndex retriever over a :class:`twotower.Index` (``pip install 'twotower[llama-index]'``)."""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.callbacks import CallbackManager
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from twotower.api.index import Hit
from twotower.errors import TwoTowerError
from twotower.integrations.search import PASSAGE, as_index, check_filter, check_passages, check_whole_documents, \
    hit_metadata, hit_passages, joined_text, passage_metadata, search, search_options

__all__ = ["TwoTowerRetriever", "to_twotower_filter"]

# LlamaIndex's operators with the same meaning in twotower's filter language (retrieval.filters)
_OPERATORS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt", FilterOperator.GTE: "$gte",
              FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte", FilterOperator.IN: "$in",
              FilterOperator.NIN: "$nin"}
_CONDITIONS = {FilterCondition.AND: "$and", FilterCondition.OR: "$or"}


def to_twotower_filter(filters: MetadataFilters | MetadataFilter, prefix: str = "") -> dict:
    """LlamaIndex ``MetadataFilters`` (nested, ``FilterCondition`` AND / OR) as twotower's filter language:
    ``FilterOperator`` EQ NE GT GTE LT LTE IN NIN become ``$eq $ne $gt $gte $lt $lte $in $nin`` on the key (a
    dotted key reaches into nested metadata), AND / OR become ``$and`` / ``$or``. Other operators (TEXT_MATCH,
    CONTAINS, ANY, ALL, IS_EMPTY …) and the NOT condition have no exact counterpart: a :class:`TwoTowerError`
    naming them. ``prefix``: put before each key (where the metadata lies inside the stored metadata).

    Example::

        from llama_index.core.vector_stores import FilterOperator, MetadataFilter, MetadataFilters

        f = MetadataFilters(filters=[MetadataFilter(key="year", value=2020, operator=FilterOperator.GTE),
                                     MetadataFilter(key="source", value=["wiki", "pubmed"], operator=FilterOperator.IN)])
        assert to_twotower_filter(f) == {"$and": [{"year": {"$gte": 2020}}, {"source": {"$in": ["wiki", "pubmed"]}}]}
    """
    if isinstance(filters, MetadataFilter):
        op = _OPERATORS.get(filters.operator)
        if op is None:
            raise TwoTowerError(f"filters: FilterOperator.{filters.operator.name} (on {filters.key!r}) has no exact "
                                f"twotower counterpart; use one of {', '.join(o.name for o in _OPERATORS)}, or "
                                "pass a twotower filter dict (docs: Your documents: metadata and filters)")
        return {prefix + filters.key: {op: filters.value}}
    if not isinstance(filters, MetadataFilters):
        raise TwoTowerError(f"filters: give llama_index MetadataFilters or a twotower filter dict, not "
                            f"{type(filters).__name__}")
    condition = _CONDITIONS.get(filters.condition or FilterCondition.AND)
    if condition is None:
        raise TwoTowerError(f"filters: FilterCondition.{filters.condition.name} has no twotower counterpart; use AND "
                            "or OR (negate each filter instead: NE, NIN)")
    if not filters.filters:
        return {}
    return {condition: [to_twotower_filter(f, prefix) for f in filters.filters]}


def passage_node(hit: Hit, passage, node_id: str) -> TextNode:
    """A hit's ``passage`` as a LlamaIndex node ``node_id`` of the hit's document (its source): the passage's text,
    its place in the document's text, the document's metadata with the passage's place under ``"passage"`` (hidden
    from the LLM's and the embedding's view of the node)."""
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo

    return TextNode(id_=node_id, text=passage.text,
                    metadata=passage_metadata(hit.id, hit.title, hit.score, passage, hit.metadata),
                    start_char_idx=passage.start, end_char_idx=passage.end,
                    excluded_llm_metadata_keys=[PASSAGE], excluded_embed_metadata_keys=[PASSAGE],
                    relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=hit.id)})


class TwoTowerRetriever(BaseRetriever):
    """A LlamaIndex retriever returning :meth:`twotower.Index.search`'s top ``k`` as ``NodeWithScore`` objects
    holding ``TextNode`` objects, best first.

    ``index``: a :class:`twotower.Index` or the path of an index directory. ``k`` (default 10) and the keyword
    options are :meth:`~twotower.Index.search`'s (``mode``, ``lam``, ``norm``, ``prf_depth``, ``prf_weight``,
    ``rerank``, ``rerank_depth``, ``ef_search``, ``nprobe``); left out, a search uses the model's fitted mode, else
    dense. ``filters``: LlamaIndex ``MetadataFilters`` (translated by :func:`to_twotower_filter`) or a twotower
    filter dict (:func:`twotower.parse_filter`): only the documents it lets through are searched. They are checked
    against the index here, and a re-ranker given as a directory is loaded here, once. ``callback_manager`` and ``verbose`` go to LlamaIndex's ``BaseRetriever``.

    By default each node is the best passage of a hit's document for the query (what a RAG prompt needs, not the
    whole document): ``text`` = the passage (``text[start:end]`` of the document's text), ``start_char_idx`` /
    ``end_char_idx`` = its place there (code points), ``id_`` and its source relationship (``node.ref_doc_id``) =
    the document's id, and ``metadata`` = the document's metadata as it was given plus one key, ``"passage"``:
    ``{"document_id", "title", "start", "end", "score", "passage_score"}`` (``"page"`` too when the passage has
    one; kept out of what the LLM and the embedding see; a document whose metadata already holds ``"passage"`` is
    refused, by name); the ``NodeWithScore``'s score is the document's (exactly :meth:`~twotower.Index.search`'s).
    ``passages=N``: each hit's N best passages, one node each, hit by hit, best first, each ``id_`` the document's
    id with the span (``"d1:120-480"``) so that a hit's nodes are distinct. ``whole_documents=True``: one node per
    hit with ``id_`` = the document's id, ``text`` = title and text joined as twotower joins them for its encoder
    (``"title text"``; the text alone when there is no title) and ``metadata`` = the document's metadata exactly as
    it was given (:attr:`twotower.Hit.metadata`: nothing added, removed or renamed). The query is the bundle's
    ``query_str`` (twotower encodes it; a bundle's own embedding is not used). ``aretrieve`` runs the search in a
    worker thread, so the event loop keeps running; searches of one index run one at a time (its tokenizer is not
    thread-safe).

    Example::

        import twotower as tt
        from twotower.integrations.llama_index import TwoTowerRetriever

        index = tt.Index.build("tea-index", [{"_id": "d1", "text": "Green tea is steamed.", "type": "tea"},
                                             {"_id": "d2", "text": "Coffee is roasted.", "type": "coffee"}], bm25=True)
        retriever = TwoTowerRetriever(index, k=1, mode="bm25")  # or TwoTowerRetriever("tea-index")
        nodes = retriever.retrieve("green tea")        # await retriever.aretrieve("green tea") in async code
        print(nodes[0].node.id_, nodes[0].score, nodes[0].node.text, nodes[0].node.start_char_idx)
        from llama_index.core.vector_stores import MetadataFilter, MetadataFilters

        teas = TwoTowerRetriever(index, k=2, filters=MetadataFilters(filters=[MetadataFilter(key="type", value="tea")]))
        print([n.node.metadata for n in teas.retrieve("a hot drink")])  # [{"type": "tea"}]
    """

    def __init__(self, index: Any, k: int = 10, *, mode: str | None = None, lam: float | None = None,
                 norm: str | None = None, prf_depth: int | None = None, prf_weight: float | None = None,
                 rerank: Any = None, rerank_depth: int | None = None, ef_search: int | None = None,
                 nprobe: int | None = None, filters: MetadataFilters | dict | None = None,
                  callback_manager: CallbackManager | None = None, verbose: bool = False,
                 passages: int = 1, whole_documents: bool = False, **unknown: Any) -> None:
        if unknown:  # a misspelt option (ef_serach=) is named here, as LangChain's retriever names it
            from twotower.errors import TwoTowerError

            raise TwoTowerError(f"TwoTowerRetriever: unknown option(s) {', '.join(sorted(unknown))}; it takes k, "
                                "mode, lam, norm, prf_depth, prf_weight, rerank, rerank_depth, ef_search, nprobe, "
                                "filters, callback_manager, verbose, passages, whole_documents")
        self.index = as_index(index)
        self.k = k
        self.passages = check_passages(passages)
        self.whole_documents = check_whole_documents(whole_documents)
        self.filter = check_filter(filters if filters is None or isinstance(filters, dict)
                                   else to_twotower_filter(filters))
        self.options = search_options(self.index, k, mode=mode, lam=lam, norm=norm, prf_depth=prf_depth,
                                      prf_weight=prf_weight, rerank=rerank, rerank_depth=rerank_depth,
                                      ef_search=ef_search, nprobe=nprobe)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @staticmethod
    def _node(hit: Hit) -> NodeWithScore:
        return NodeWithScore(node=TextNode(id_=hit.id, text=joined_text(hit), metadata=hit_metadata(hit)),
                             score=hit.score)

    def _passage_nodes(self, hit: Hit) -> list[NodeWithScore]:
        return [NodeWithScore(node=passage_node(hit, p, hit.id if self.passages == 1 else
                                                f"{hit.id}:{p.start}-{p.end}"), score=hit.score)
                for p in hit_passages(hit)]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = search(self.index, query_bundle.query_str, self.k,
                      {**self.options, "filter": self.filter, "passages": self.passages})
        if self.whole_documents:
            return [self._node(hit) for hit in hits]
        return [node for hit in hits for node in self._passage_nodes(hit)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
