"""A LlamaIndex vector store over a twotower index (``pip install 'twotower[llama-index]'``)."""

from __future__ import annotations

import copy
from typing import Any

from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, MetadataFilters, VectorStoreQuery,
                                                  VectorStoreQueryMode, VectorStoreQueryResult)
from pydantic import PrivateAttr

from twotower.errors import TwoTowerError
from twotower.integrations.search import PASSAGE, check_whole_documents, hit_passages, passage_metadata
from twotower.integrations.store import IndexHolder, selects_all

__all__ = ["TwoTowerVectorStore"]

# where a node lies in twotower's metadata: its own metadata (exactly), the rest of the node, its source document
META, NODE, REF = "metadata", "node", "ref_doc_id"
_MODES = {VectorStoreQueryMode.DEFAULT: "dense", VectorStoreQueryMode.HYBRID: "hybrid",
          VectorStoreQueryMode.TEXT_SEARCH: "bm25", VectorStoreQueryMode.SPARSE: "bm25"}


def _stored(node: BaseNode) -> dict:
    """A node as twotower's metadata: ``{"metadata": node.metadata, "node": the rest of it, "ref_doc_id"}``."""
    if not isinstance(node, TextNode):
        raise TwoTowerError(f"nodes: a TextNode (text and metadata), not {type(node).__name__}")
    rest = node.model_dump(mode="json", exclude={"embedding", "text", "metadata", "id_"})
    return {META: copy.deepcopy(node.metadata), NODE: rest, REF: node.ref_doc_id}


def _node(doc_id: str, text: str, stored: dict) -> TextNode:
    """The node :func:`_stored` wrote (a document not written by this store: a TextNode of its text and metadata)."""
    if NODE not in stored:
        return TextNode(id_=doc_id, text=text, metadata=copy.deepcopy(stored))
    return TextNode.model_validate({**stored[NODE], "id_": doc_id, "text": text,
                                    "metadata": copy.deepcopy(stored.get(META) or {})})


class TwoTowerVectorStore(BasePydanticVectorStore):
    """A LlamaIndex ``BasePydanticVectorStore`` whose nodes live in a :class:`twotower.Index` (``stores_text``:
    queries return whole nodes, text and metadata).

    ``TwoTowerVectorStore(path=None, embedding=None, **index_options)`` opens the index at ``path``, or makes it
    on the first ``add`` (None: a temporary folder, removed with the store). Nodes come with their embeddings
    (``VectorStoreIndex`` computes them with its ``embed_model``: :class:`TwoTowerEmbedding` for twotower's
    towers); ``embedding`` (a LlamaIndex embedding model, recorded in the index and needed again when reopened)
    embeds nodes that have none and queries given as text only. ``index_options``: :meth:`twotower.Index.build`'s
    (``kind``, ``bm25`` for ``HYBRID`` / ``TEXT_SEARCH`` queries, ``backend`` ...).

    A query returns, for each node found, its best passage for the query (an index that twotower's encoder built
    splits a document longer than its window into passages, one vector each, scored as its best:
    :meth:`twotower.Index.build`'s ``passages=tt.Passages(window=...)``; a node added with its embedding is one vector, and its
    passage its whole text): the node comes back with ``text`` = that passage (``node_text[start:end]``), its
    ``start_char_idx`` / ``end_char_idx`` moved onto the passage when the node had them, and ``metadata`` = the
    node's metadata plus one key, ``"passage"``: ``{"document_id" (the node's id), "title", "start", "end",
    "score", "passage_score"}`` (``"page"`` too when the passage has one; offsets in code points into the node's
    text; kept out of what the LLM and the embedding see; a node whose metadata already holds ``"passage"`` is
    refused, by name). ``whole_documents=True``: each node whole, its ``metadata`` exactly as added. ``get_nodes``
    returns whole nodes either way: the id is the node's, the text its text, and the rest of the node
    (relationships, templates) is kept beside them.

    ``delete(ref_doc_id)`` removes a source document's nodes (a string: anything else is refused),
    ``delete_nodes(node_ids, filters)`` the nodes ``node_ids`` that ``filters`` let through (one or both given; an
    empty filter is refused, as the HTTP service refuses one: ``clear()`` empties the store). ``get_nodes`` takes
    ids and filters too. Filters: ``MetadataFilters`` with EQ NE GT GTE LT LTE IN NIN and AND / OR
    (:func:`to_twotower_filter`), or a twotower filter dict (``$and`` / ``$or`` / ``$not`` at any depth), on the
    node's metadata. ``similarity_top_k=0`` finds nothing. Scores: cosine similarities (higher is better).

    Example::

        from llama_index.core.schema import TextNode
        from llama_index.core.vector_stores.types import VectorStoreQuery
        from twotower.integrations.llama_index import TwoTowerVectorStore

        store = TwoTowerVectorStore()
        store.add([TextNode(id_="t", text="Green tea.", metadata={"id": 7}, embedding=[1.0, 0.0]),
                   TextNode(id_="c", text="Coffee.", embedding=[0.0, 1.0])])
        result = store.query(VectorStoreQuery(query_embedding=[0.9, 0.1], similarity_top_k=1))
        print(result.ids, result.similarities, result.nodes[0].text, result.nodes[0].metadata["passage"])
    """

    stores_text: bool = True
    flat_metadata: bool = False
    _holder: Any = PrivateAttr(default=None)
    _embedding: Any = PrivateAttr(default=None)
    _whole: bool = PrivateAttr(default=False)

    def __init__(self, path=None, embedding=None, *, whole_documents: bool = False, **index_options: Any) -> None:
        super().__init__(stores_text=True)
        self._whole = check_whole_documents(whole_documents)
        self._holder = IndexHolder(path, embedding, index_options)
        self._embedding = embedding

    @property
    def whole_documents(self) -> bool:
        """Whether queries return whole nodes (True) or each node's best passage (False, the default)."""
        return self._whole

    @classmethod
    def class_name(cls) -> str:
        return "TwoTowerVectorStore"

    @property
    def client(self):
        """The :class:`twotower.Index` (None while the store is empty)."""
        return self._holder.index

    @property
    def path(self):
        """The index folder."""
        return self._holder.path

    # ------------------------------------------------------------------ writes
    def add(self, nodes, **kwargs: Any) -> list[str]:
        """Add (or, for ids already there, replace) ``nodes``; returns their ids."""
        nodes = list(nodes)
        if not nodes:
            return []
        stored = [_stored(n) for n in nodes]
        vectors = [n.embedding for n in nodes]
        missing = [i for i, v in enumerate(vectors) if v is None]
        if missing:
            if self._embedding is None:
                raise TwoTowerError(f"nodes: node {nodes[missing[0]].node_id!r} has no embedding: embed the nodes "
                                    "(VectorStoreIndex does, with its embed_model) or give the store embedding=")
            texts = [nodes[i].get_content(metadata_mode=MetadataMode.EMBED) for i in missing]
            for i, v in zip(missing, self._embedding.get_text_embedding_batch(texts)):
                vectors[i] = v
        return self._holder.upsert([n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes],
                                   [n.node_id for n in nodes], stored, vectors=vectors)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Remove the nodes of the source document ``ref_doc_id`` (none there: no error)."""
        if not isinstance(ref_doc_id, str):
            raise TwoTowerError(f"delete: ref_doc_id is the id of a source document (a string), not "
                                f"{type(ref_doc_id).__name__} {ref_doc_id!r}")
        self._holder.delete(self._holder.ids_matching({REF: {"$eq": ref_doc_id}}))

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Remove the nodes ``node_ids`` that ``filters`` let through (either left out: no restriction from it). An
        empty filter, or neither given, is refused: ``clear()`` removes every node."""
        if filters is not None and selects_all(self._filter(filters)):
            raise TwoTowerError("delete_nodes: an empty filter would select every node (this one lets every node "
                                "through): give a non-empty one, or node_ids alone, or call clear() to remove every "
                                "node")
        if node_ids is None and filters is None:
            raise TwoTowerError("delete_nodes: give node_ids and/or a non-empty filter (clear() removes every node)")
        self._holder.delete(self._ids(node_ids, filters))

    def clear(self) -> None:
        """Remove every node (the folder's index goes)."""
        self._holder.clear()

    # ------------------------------------------------------------------ reads
    def _filter(self, filters) -> dict | None:
        """``filters`` (MetadataFilters or a twotower filter dict) on the node's metadata (None: none given; ``{}``
        or a filter that lets everything through: as given, for :meth:`delete_nodes` to refuse)."""
        if filters is None:
            return None
        if isinstance(filters, dict):  # a twotower filter dict: on the node's metadata
            from twotower.retrieval.filters import parse_filter

            parse_filter(filters)
            return _prefixed(filters)
        from twotower.integrations.llama_index.retriever import to_twotower_filter

        return to_twotower_filter(filters, prefix=f"{META}.")

    def _ids(self, node_ids, filters) -> list[str] | None:
        flt = self._filter(filters)
        if flt is not None and selects_all(flt):
            flt = None
        if flt is None:
            return None if node_ids is None else list(node_ids)
        matching = self._holder.ids_matching(flt)
        if node_ids is None:
            return matching
        wanted = set(node_ids)
        return [i for i in matching if i in wanted]

    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes ``node_ids`` (in that order) that ``filters`` let through; both left out: every node."""
        ids = self._ids(node_ids, filters)
        if ids is None:
            ids = self._holder.ids_matching(None)
        return [_node(d["_id"], d["text"], d["metadata"]) for d in self._holder.documents(ids)]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` best nodes for the query's embedding (or its text: ``TEXT_SEARCH`` /
        ``SPARSE`` search BM25, ``HYBRID`` both, weighted by ``alpha``), within ``filters``, ``doc_ids`` (source
        documents) and ``node_ids``."""
        mode = _MODES.get(query.mode)
        if mode is None:
            raise TwoTowerError(f"query: mode {query.mode.value!r} is not supported; use default, hybrid, "
                                "text_search or sparse")
        flt = self._filter(query.filters)
        if flt is not None and selects_all(flt):
            flt = None
        if query.doc_ids:
            only = {REF: {"$in": list(query.doc_ids)}}
            flt = only if flt is None else {"$and": [flt, only]}
        k = _top_k(query.similarity_top_k)
        vector = query.query_embedding if mode != "bm25" else None
        if mode != "bm25" and vector is None:
            if self._embedding is None or not query.query_str:
                raise TwoTowerError("query: give query_embedding (or a query_str with the store's embedding=)")
            vector = self._embedding.get_query_embedding(query.query_str)
        if k == 0:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        text = query.query_str if mode != "dense" else None
        options = {"mode": mode, **({"lam": query.alpha} if mode == "hybrid" and query.alpha is not None else {})}
        depth = max(k, len(self._holder)) if query.node_ids else k
        hits = self._holder.search(text, depth, filter=flt, query_vector=vector, **options)
        if query.node_ids:
            wanted = set(query.node_ids)
            hits = [h for h in hits if h.id in wanted][:k]
        nodes = [_node(h.id, h.text, h.metadata) if self._whole else _passage_node(h) for h in hits]
        return VectorStoreQueryResult(nodes=nodes, similarities=[h.score for h in hits], ids=[h.id for h in hits])


def _top_k(value) -> int:
    """``similarity_top_k`` as a count: None is LlamaIndex's default (1), 0 finds nothing."""
    if value is None:
        return 1
    from twotower.checks import check_number

    check_number(value, "similarity_top_k", integer=True, minimum=0)
    return int(value)


def _passage_node(hit) -> TextNode:
    """The node of ``hit`` cut to its best passage: its text, the passage's place under ``metadata["passage"]``
    (hidden from the LLM's and the embedding's view), and ``start_char_idx`` / ``end_char_idx`` moved onto the
    passage when the node had them."""
    node = _node(hit.id, hit.text, hit.metadata)
    passage = hit_passages(hit)[0]
    update = {"text": passage.text,
              "metadata": passage_metadata(hit.id, hit.title, hit.score, passage, node.metadata),
              "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys, PASSAGE],
              "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys, PASSAGE]}
    if node.start_char_idx is not None:
        update["start_char_idx"] = node.start_char_idx + passage.start
        update["end_char_idx"] = node.start_char_idx + passage.end
    return node.model_copy(update=update)


def _prefixed(flt):
    """A twotower filter dict with each field moved under the node's metadata, at any depth: inside ``$and`` /
    ``$or`` (lists of filters) and ``$not`` (a filter); ``$text`` (the node's text) and each field's operators
    kept as they are."""
    if not isinstance(flt, dict):
        return flt  # not a filter: parse_filter names it
    out = {}
    for key, value in flt.items():
        if key in ("$and", "$or") and isinstance(value, (list, tuple)):
            out[key] = [_prefixed(f) for f in value]
        elif key == "$not":
            out[key] = _prefixed(value)
        elif isinstance(key, str) and key.startswith("$"):
            out[key] = value
        else:
            out[f"{META}.{key}"] = value
    return out
