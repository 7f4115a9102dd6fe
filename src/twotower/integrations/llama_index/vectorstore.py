"""A LlamaIndex vector store over a twotower index (``pip install 'twotower[llama-index]'``)."""

from __future__ import annotations

import copy
from typing import Any

from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (BasePydanticVectorStore, MetadataFilters, VectorStoreQuery,
                                                  VectorStoreQueryMode, VectorStoreQueryResult)
from pydantic import PrivateAttr

from twotower.errors import TwoTowerError
from twotower.integrations.store import IndexHolder

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

    A node's ``metadata`` comes back exactly as added (any key); its id is the document's id, its text the
    document's text, and the rest of the node (relationships, templates) is kept beside them. ``delete`` removes a
    source document's nodes, ``delete_nodes`` / ``get_nodes`` take ids and ``MetadataFilters``, ``clear`` empties
    the store. Filters: EQ NE GT GTE LT LTE IN NIN with AND / OR (:func:`to_twotower_filter`), on the node's
    metadata. Scores: cosine similarities (higher is better).

    Example::

        from llama_index.core.schema import TextNode
        from llama_index.core.vector_stores.types import VectorStoreQuery
        from twotower.integrations.llama_index import TwoTowerVectorStore

        store = TwoTowerVectorStore()
        store.add([TextNode(id_="t", text="Green tea.", metadata={"id": 7}, embedding=[1.0, 0.0]),
                   TextNode(id_="c", text="Coffee.", embedding=[0.0, 1.0])])
        result = store.query(VectorStoreQuery(query_embedding=[0.9, 0.1], similarity_top_k=1))
        print(result.ids, result.similarities, result.nodes[0].metadata)
    """

    stores_text: bool = True
    flat_metadata: bool = False
    _holder: Any = PrivateAttr(default=None)
    _embedding: Any = PrivateAttr(default=None)

    def __init__(self, path=None, embedding=None, **index_options: Any) -> None:
        super().__init__(stores_text=True)
        self._holder = IndexHolder(path, embedding, index_options)
        self._embedding = embedding

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
        self._holder.delete(self._holder.ids_matching({REF: ref_doc_id}))

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Remove the nodes ``node_ids`` that ``filters`` let through (either left out: no restriction from it;
        both left out: every node)."""
        self._holder.delete(self._ids(node_ids, filters))

    def clear(self) -> None:
        """Remove every node (the folder's index goes)."""
        self._holder.clear()

    # ------------------------------------------------------------------ reads
    def _filter(self, filters) -> dict | None:
        if filters is None:
            return None
        if isinstance(filters, dict):  # a twotower filter dict: on the node's metadata
            from twotower.retrieval.filters import parse_filter

            parse_filter(filters)
            return _prefixed(filters)
        from twotower.integrations.llama_index.retriever import to_twotower_filter

        return to_twotower_filter(filters, prefix=f"{META}.") or None

    def _ids(self, node_ids, filters) -> list[str] | None:
        flt = self._filter(filters)
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
        if query.doc_ids:
            only = {REF: {"$in": list(query.doc_ids)}}
            flt = only if flt is None else {"$and": [flt, only]}
        k = query.similarity_top_k or 1
        vector = query.query_embedding if mode != "bm25" else None
        if mode != "bm25" and vector is None:
            if self._embedding is None or not query.query_str:
                raise TwoTowerError("query: give query_embedding (or a query_str with the store's embedding=)")
            vector = self._embedding.get_query_embedding(query.query_str)
        text = query.query_str if mode != "dense" else None
        options = {"mode": mode, **({"lam": query.alpha} if mode == "hybrid" and query.alpha is not None else {})}
        depth = max(k, len(self._holder)) if query.node_ids else k
        hits = self._holder.search(text, depth, filter=flt, query_vector=vector, **options)
        if query.node_ids:
            wanted = set(query.node_ids)
            hits = [h for h in hits if h.id in wanted][:k]
        return VectorStoreQueryResult(nodes=[_node(h.id, h.text, h.metadata) for h in hits],
                                      similarities=[h.score for h in hits], ids=[h.id for h in hits])


def _prefixed(flt: dict) -> dict:
    """A twotower filter dict with each field moved under the node's metadata (operators and lists kept)."""
    out = {}
    for key, value in flt.items():
        if key in ("$and", "$or"):
            out[key] = [_prefixed(f) for f in value]
        elif key.startswith("$"):
            out[key] = value
        else:
            out[f"{META}.{key}"] = value
    return out
