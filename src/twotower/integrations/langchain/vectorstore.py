"""A LangChain ``VectorStore`` over a twotower index (``pip install 'twotower[langchain]'``)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from twotower.errors import TwoTowerError
from twotower.integrations.search import check_whole_documents, hit_passages, passage_metadata
from twotower.integrations.store import IndexHolder, check_ids

__all__ = ["TwoTowerVectorStore"]


def _doc(doc_id: str, title: str, text: str, metadata: dict) -> Document:
    """A stored document as LangChain's: ``page_content`` the text (after the title, when it has one: as the
    retriever joins them), ``id`` the id, ``metadata`` exactly as given (a copy)."""
    content = f"{title} {text}".strip() if title else text
    return Document(page_content=content, id=doc_id, metadata=copy.deepcopy(metadata))


def _passage_doc(hit) -> Document:
    """A hit as its best passage: ``page_content`` the passage, ``id`` the document's id, ``metadata`` the
    document's with the passage's place under ``"passage"``."""
    passage = hit_passages(hit)[0]
    return Document(page_content=passage.text, id=hit.id,
                    metadata=passage_metadata(hit.id, hit.title, hit.score, passage, hit.metadata))


class TwoTowerVectorStore(VectorStore):
    """A LangChain ``VectorStore`` whose documents live in a :class:`twotower.Index`.

    ``TwoTowerVectorStore(path=None, embedding=None, **index_options)`` opens the index at ``path``, or makes it
    on the first write (None: a temporary folder, removed with the store). ``embedding``: any LangChain
    ``Embeddings`` (the index records its class, and needs it again when reopened); None: a twotower encoder
    (``index_options["encoder"]``, else all-MiniLM-L6-v2), whose query and document towers encode queries and
    documents. ``index_options``: :meth:`twotower.Index.build`'s (``kind``, ``bm25``, ``backend``, ``encoder``,
    ``precision`` ...), used when the index is built.

    A search returns, for each document found, its **best passage** for the query (a document longer than the
    encoder's window is split into passages, one vector each, and scores as its best: :meth:`twotower.Index.build`'s
    ``passages=tt.Passages(window=...)``): ``page_content`` = the passage (``text[start:end]`` of the document's text), ``id`` = the
    document's id, ``metadata`` = the document's metadata plus one key, ``"passage"``: ``{"document_id", "title",
    "start", "end", "score", "passage_score"}`` (code-point offsets into the document's text; ``"page"`` too when
    the passage has one; a document whose metadata already holds ``"passage"`` is refused, by name).
    ``whole_documents=True``: each document whole, its ``metadata`` exactly as given. ``get_by_ids`` returns whole
    documents either way. Maximal marginal relevance compares each candidate's best passage for the query.

    Documents keep their ``metadata`` exactly as given (any JSON key, ``id`` included) and their ``id`` (a string:
    other ids are refused rather than stored as their text); an id added again replaces the document (upsert), and
    of one id given twice in one call the last text stays. ``delete(ids)`` removes those there (unknown ids are no
    error) and returns whether it removed any; every document goes only with ``delete(delete_all=True)``
    (``delete()`` without ids is refused), and the store is empty again (its index folder goes). Searches take
    ``filter=`` (twotower's filter language: ``{"field": value}``, ``$eq $ne $gt $gte $lt $lte $in $nin $exists``,
    ``$and`` / ``$or`` / ``$not``) and :meth:`twotower.Index.search`'s options (``mode="hybrid"`` with ``bm25=True``
    ...). Scores are the index's (cosine similarity for your own embeddings: higher is better); relevance scores
    map them to [0, 1].

    Example::

        from twotower.integrations.langchain import TwoTowerVectorStore

        store = TwoTowerVectorStore.from_texts(["Green tea is steamed.", "Coffee is roasted."],
                                               metadatas=[{"kind": "tea"}, {"kind": "coffee"}], ids=["t", "c"])
        doc, score = store.similarity_search_with_score("green tea", k=1, filter={"kind": "tea"})[0]
        print(doc.id, doc.page_content, doc.metadata["kind"], doc.metadata["passage"]["start"], round(score, 3))
        store.delete(["c"])
        retriever = store.as_retriever(search_kwargs={"k": 1})
    """

    def __init__(self, path=None, embedding: Embeddings | None = None, *, whole_documents: bool = False,
                 **index_options: Any) -> None:
        if embedding is not None and not isinstance(embedding, Embeddings):
            raise TwoTowerError(f"embedding: a LangChain Embeddings, not {type(embedding).__name__} (a plain function:"
                                " tt.Index.build(..., embedding=f))")
        self._whole = check_whole_documents(whole_documents)
        self._holder = IndexHolder(path, embedding, index_options)
        self._embedding = embedding

    @property
    def whole_documents(self) -> bool:
        """Whether searches return whole documents (True) or each document's best passage (False, the default)."""
        return self._whole

    def _found(self, hit) -> Document:
        return _doc(hit.id, hit.title, hit.text, hit.metadata) if self._whole else _passage_doc(hit)

    @property
    def index(self):
        """The :class:`twotower.Index` (None while the store is empty)."""
        return self._holder.index

    @property
    def path(self):
        """The index folder."""
        return self._holder.path

    @property
    def embeddings(self) -> Embeddings:
        """The embedding given, else :class:`TwoTowerEmbeddings` over the index's twotower encoder."""
        if self._embedding is not None:
            return self._embedding
        from twotower.integrations.langchain.embeddings import TwoTowerEmbeddings

        if self.index is not None:
            return TwoTowerEmbeddings(self.index.encoder)
        return TwoTowerEmbeddings(self._holder.options.get("encoder"))

    # ------------------------------------------------------------------ writes
    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                  **kwargs: Any) -> list[str]:
        """Add (or, for ids already there, replace) ``texts``; returns their ids (new UUIDs where none given). Ids are
        strings (another type is refused); of one id given twice, the last text stays."""
        if kwargs:
            raise TwoTowerError(f"add_texts: unknown option(s) {', '.join(sorted(kwargs))}")
        return self._holder.upsert(list(texts), None if ids is None else check_ids(ids, "add_texts", none=True),
                                   list(metadatas) if metadatas is not None else None)

    def delete(self, ids: list[str] | None = None, *, delete_all: bool = False, **kwargs: Any) -> bool:
        """Remove the documents ``ids`` (ids not in the store are skipped); True when at least one was removed,
        False when none was there. ``delete_all=True`` (without ids): every document; ``delete()`` alone is refused
        (an empty selection does not mean everything here)."""
        if kwargs:
            raise TwoTowerError(f"delete: unknown option(s) {', '.join(sorted(kwargs))}")
        if not isinstance(delete_all, bool):
            raise TwoTowerError(f"delete: delete_all is True or False, not {delete_all!r}")
        if delete_all:
            if ids is not None:
                raise TwoTowerError("delete: give ids or delete_all=True, not both")
            removed = len(self._holder)
            self._holder.clear()
            return removed > 0
        if ids is None:
            raise TwoTowerError("delete: give the ids to remove; delete(delete_all=True) removes every document")
        return self._holder.delete(check_ids(ids, "delete")) > 0

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of ``ids`` that are in the store, whole, in the order given (ids are strings)."""
        return [_doc(d["_id"], d["title"], d["text"], d["metadata"])
                for d in self._holder.documents(check_ids(ids, "get_by_ids"))]

    # ------------------------------------------------------------------ searches
    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` best documents (each as its best passage, unless ``whole_documents``) with their scores (higher
        is better), ``filter`` and :meth:`twotower.Index.search`'s options applied. A vector store ranks by vectors:
        ``mode`` is ``dense`` (cosine scores, as the relevance scores assume) unless given (``mode="hybrid"`` on an
        index with BM25; :class:`~twotower.integrations.langchain.TwoTowerRetriever` takes the index's default)."""
        kwargs.setdefault("mode", "dense")
        return [(self._found(h), h.score) for h in self._holder.search(query, k, filter=filter, **kwargs)]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """The ``k`` best documents for ``query``."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter, **kwargs)]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict | None = None,
                                    **kwargs: Any) -> list[Document]:
        """The ``k`` best documents for a query vector (dense search)."""
        return [self._found(h) for h in self._holder.search(None, k, filter=filter, query_vector=embedding, **kwargs)]

    def _select_relevance_score_fn(self):
        return lambda score: min(1.0, max(0.0, (1.0 + score) / 2.0))  # cosine in [-1, 1] to [0, 1]

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict | None = None,
                                                **kwargs: Any) -> list[Document]:
        """``k`` documents among the ``fetch_k`` nearest, chosen for relevance and diversity (``lambda_mult``: 1
        relevance only, 0 diversity only), each document compared by the vector of its best passage for the
        query (the passage that ranked it)."""
        hits = self._holder.search(None, fetch_k, filter=filter, query_vector=embedding, **kwargs)
        if not hits:
            return []
        query = self._holder.projected(embedding)
        vectors = self._holder.best_vectors([h.id for h in hits], query)
        chosen = maximal_marginal_relevance(query, vectors, lambda_mult=lambda_mult, k=k)
        return [self._found(hits[i]) for i in chosen]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """As :meth:`max_marginal_relevance_search_by_vector`, for the query's vector as the index encodes it."""
        if self.index is None:
            return []
        return self.max_marginal_relevance_search_by_vector(self._holder.query_vector(query).tolist(), k, fetch_k,
                                                            lambda_mult, filter=filter, **kwargs)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None, metadatas: list[dict] | None = None,
                   *, ids: list[str] | None = None, path=None, whole_documents: bool = False,
                   **index_options: Any) -> "TwoTowerVectorStore":
        """A store (at ``path``, None: a temporary folder) holding ``texts``."""
        store = cls(path, embedding, whole_documents=whole_documents, **index_options)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    def from_documents(cls, documents: list[Document], embedding: Embeddings | None = None,
                       **kwargs: Any) -> "TwoTowerVectorStore":
        """A store holding ``documents`` (their ids kept; new UUIDs for those without)."""
        return super().from_documents(documents, embedding, **kwargs)

