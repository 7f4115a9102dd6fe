"""What the framework vector stores share: a twotower index that may be empty.

A :class:`twotower.Index` holds at least one document, while a LangChain or LlamaIndex vector store starts empty
and may be emptied. :class:`IndexHolder` keeps the index folder (a temporary one when no path is given) and opens
it, builds it on the first write (with the index options and the embedding given), upserts by id, deletes ids that
exist (unknown ids are no error, as both frameworks expect), and removes the folder's index when its last document
goes (so the store is empty again, and the next write builds afresh with the same options).

Example::

    from twotower.integrations.store import IndexHolder

    holder = IndexHolder(None, None, {"encoder": "all-MiniLM-L6-v2"})
    holder.upsert(["Green tea is steamed."], ["d1"], [{"id": 7}])
    assert holder.documents(["d1", "nope"])[0]["metadata"] == {"id": 7}
    holder.delete(["d1", "nope"])
    assert holder.index is None
"""

from __future__ import annotations

import copy
import inspect
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np

from twotower.errors import TwoTowerError

__all__ = ["IndexHolder"]

_NOT_OPTIONS = {"cls", "path", "corpus", "ids", "metadatas", "embedding"}


def _build_options() -> set[str]:
    from twotower.api.index import Index
    from twotower.retrieval.store import IndexSpec

    return (set(inspect.signature(Index.build).parameters) - _NOT_OPTIONS - {"options"}) | set(vars(IndexSpec()))


def _is_index(path: Path) -> bool:
    return path.is_dir() and ((path / "CURRENT").exists() or (path / "versions").exists())


class IndexHolder:
    """The index of a framework vector store at ``path`` (None: a temporary folder, removed with this object),
    built on the first write with ``options`` (:meth:`twotower.Index.build`'s keyword arguments) and
    ``embedding`` (None: a twotower encoder, ``options["encoder"]`` or the default)."""

    def __init__(self, path, embedding, options: dict) -> None:
        unknown = sorted(set(options) - _build_options())
        if unknown:
            raise TwoTowerError(f"index options: unknown {', '.join(unknown)}; they are tt.Index.build's "
                                "(encoder, kind, bm25, backend, ...)")
        if embedding is not None and options.get("encoder") is not None:
            raise TwoTowerError("give embedding (your own) or encoder (a twotower model), not both")
        self._tmp = tempfile.TemporaryDirectory(prefix="twotower-store-") if path is None else None
        self.path = Path(self._tmp.name) / "index" if path is None else Path(path)
        self.embedding = embedding
        self.options = {"show_progress": False, **options}
        self.lock = threading.RLock()
        self.index = None
        if _is_index(self.path):
            from twotower.api.index import Index

            self.index = Index.open(self.path, embedding=embedding, device=options.get("device", "auto"),
                                    precision=options.get("precision", "auto"))

    def __len__(self) -> int:
        return 0 if self.index is None else len(self.index)

    # ------------------------------------------------------------------ writes
    def upsert(self, texts: list[str], ids: list | None, metadatas: list | None, vectors=None) -> list[str]:
        """Add ``texts`` (ids: given, else new UUIDs; an id already there is replaced, and of one id given twice
        the last stays); returns the ids, in order."""
        texts = list(texts)
        ids = [str(uuid.uuid4()) if i is None else i for i in (ids or [None] * len(texts))]
        metadatas = [copy.deepcopy(m) if m else {} for m in (metadatas or [None] * len(texts))]
        if len(ids) != len(texts) or len(metadatas) != len(texts):
            raise TwoTowerError(f"{len(texts)} texts, {len(ids)} ids and {len(metadatas)} metadatas: give one each")
        if not texts:
            return []
        last = {doc_id: i for i, doc_id in enumerate(ids)}  # one id twice: the last one wins
        keep = sorted(last.values())
        texts, kept_ids, metadatas = [texts[i] for i in keep], [ids[i] for i in keep], [metadatas[i] for i in keep]
        if vectors is not None:
            vectors = np.asarray(vectors, dtype=np.float32)[keep]
        from twotower.api.index import Index

        with self.lock:
            if self.index is None:
                extra = {"vectors": vectors} if vectors is not None else {}
                self.index = Index.build(self.path, texts, ids=kept_ids, metadatas=metadatas,
                                         embedding=self.embedding, **self.options, **extra)
            else:
                self.index.add(texts, ids=kept_ids, metadatas=metadatas, replace=True, vectors=vectors)
        return ids

    def delete(self, ids=None) -> None:
        """Remove the documents ``ids`` that are there (None: all); the last one removes the folder's index."""
        with self.lock:
            if self.index is None:
                return
            store = self.index.store
            present = _present(store, list(dict.fromkeys(store.doc_ids if ids is None else ids)))
            if not present:
                return
            if len(present) < len(self.index):
                self.index.remove(present)
                return
            self.clear()

    def clear(self) -> None:
        """Remove every document: the folder's index goes (a Milvus collection cannot be emptied this way)."""
        with self.lock:
            if self.index is None:
                return
            if self.index.info().get("backend") == "milvus":
                raise TwoTowerError("removing every document of a Milvus-backed store: drop the collection, or keep "
                                    "one document")
            self.index = None
            if _is_index(self.path):
                shutil.rmtree(self.path)

    # ------------------------------------------------------------------ reads
    def documents(self, ids) -> list[dict]:
        """``{"_id", "title", "text", "metadata"}`` of each of ``ids`` that is there, in the order given."""
        with self.lock:
            if self.index is None:
                return []
            self.index._searcher.refresh()
            store = self.index.store
            present = _present(store, list(ids))
            if hasattr(store, "prefetch"):  # a Milvus index: the documents in batched queries, not one each
                store.prefetch(present)
            return [_document(store.document(store.row_of[i])) for i in present]

    def ids_matching(self, filter) -> list[str]:
        """The ids of the documents ``filter`` lets through (None: all), in row order (a local index)."""
        with self.lock:
            if self.index is None:
                return []
            self.index._searcher.refresh()
            store = self.index.store
            if filter is None:
                return list(store.doc_ids)
            if hasattr(store, "filter_expression"):
                raise TwoTowerError("selecting documents by a filter without a query needs a local index here (a "
                                    "Milvus-backed store selects by ids)")
            from twotower.retrieval.searcher import filter_mask

            mask = filter_mask(store, filter)
            return list(store.doc_ids) if mask is None else [store.doc_ids[int(r)] for r in np.flatnonzero(mask)]

    def search(self, query=None, k: int = 4, *, filter=None, query_vector=None, **options) -> list:
        """:meth:`twotower.Index.search`'s hits for one query (a text or a vector); none when the store is empty."""
        with self.lock:
            if self.index is None:
                return []
            return self.index.search(query, k, filter=filter, query_vector=query_vector, **options)

    def query_vector(self, query: str) -> np.ndarray:
        """The query's vector, as the index's searches encode it."""
        with self.lock:
            return self.index._searcher.encode_queries([query])[0]

    def projected(self, vector) -> np.ndarray:
        """A query vector as the stored vectors are kept (their first ``dim`` dimensions, when cut)."""
        with self.lock:
            return self.index.store.project_queries(np.asarray(vector, dtype=np.float32)[None, :])[0]

    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids`` (single-vector indexes), as float32."""
        with self.lock:
            store = self.index.store
            if store.multivector:
                raise TwoTowerError("maximal marginal relevance needs one vector per document; this index is "
                                    "multi-vector")
            return store.float_vectors(np.array([store.row_of[i] for i in ids], dtype=np.int64))


def _present(store, ids: list[str]) -> list[str]:
    """Those of ``ids`` in the index, in their order; on Milvus asked in batched queries (``row_of.known``), not one
    query per id."""
    known = getattr(store.row_of, "known", None)
    if known is not None:
        found = known(ids)
        return [i for i in ids if i in found]
    return [i for i in ids if i in store.row_of]


def _document(doc: dict) -> dict:
    return {"_id": doc["_id"], "title": doc["title"], "text": doc["text"],
            "metadata": copy.deepcopy(doc.get("metadata") or {})}
