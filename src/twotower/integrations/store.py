"""What the framework vector stores share: a twotower index that may be empty.

A :class:`twotower.Index` holds at least one document, while a LangChain or LlamaIndex vector store starts empty
and may be emptied. :class:`IndexHolder` keeps the index folder (a temporary one when no path is given) and opens
it, builds it on the first write (with the index options and the embedding given), upserts by id (ids are strings;
of one id given twice in one write the last stays), deletes ids that exist (unknown ids are no error, as both
frameworks expect; every document only through :meth:`IndexHolder.clear`, never by leaving the ids out), and removes
the folder's index when its last document goes (so the store is empty again, and the next write builds afresh with
the same options).

Example::

    from twotower.integrations.store import IndexHolder

    holder = IndexHolder(None, None, {"encoder": "all-MiniLM-L6-v2"})
    holder.upsert(["Green tea is steamed."], ["d1"], [{"id": 7}])
    assert holder.documents(["d1", "nope"])[0]["metadata"] == {"id": 7}
    assert holder.delete(["d1", "nope"]) == 1
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

__all__ = ["IndexHolder", "check_ids", "selects_all"]

_NOT_OPTIONS = {"cls", "path", "corpus", "ids", "metadatas", "embedding"}


def _build_options() -> set[str]:
    from twotower.api.build_keywords import KEPT, OLD
    from twotower.api.index import Index

    return (set(inspect.signature(Index.build).parameters) - _NOT_OPTIONS - {"options"}) | set(KEPT) | set(OLD) | {
        "bm25_params"}


def check_ids(ids, where: str, *, none: bool = False) -> list:
    """``ids`` as a list of strings (``none``: None in it stands for an id to make); a :class:`TwoTowerError` naming
    ``where`` and the first id that is not a string (a number stored as ``"5"`` would not be found again as ``5``),
    or when ``ids`` is one string rather than a list of them."""
    if isinstance(ids, (str, bytes)):
        raise TwoTowerError(f"{where}: ids is a list of ids, not one string ({ids!r}): wrap it in a list")
    ids = list(ids)
    for i, doc_id in enumerate(ids):
        if not isinstance(doc_id, str) and not (none and doc_id is None):
            raise TwoTowerError(f"{where}: ids are strings; id {i} is {type(doc_id).__name__} {doc_id!r} (give "
                                f"{str(doc_id)!r} to store it as a string)")
    return ids


def selects_all(flt) -> bool:
    """Whether the filter dict ``flt`` lets every document through by its form, whatever the documents hold:
    ``None``, ``{}``, an ``$and`` of such filters, an ``$or`` holding one (a delete refuses it)."""
    if flt is None:
        return True
    from twotower.retrieval.filters import And, Or, parse_filter

    def vacuous(f) -> bool:
        if isinstance(f, And):
            return all(vacuous(p) for p in f.parts)
        if isinstance(f, Or):
            return any(vacuous(p) for p in f.parts)
        return False

    return vacuous(parse_filter(flt))


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
        ids = check_ids([None] * len(texts) if ids is None else ids, "add", none=True)
        ids = [str(uuid.uuid4()) if i is None else i for i in ids]
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

    def delete(self, ids) -> int:
        """Remove the documents ``ids`` that are there (unknown ids are skipped); the last one removes the folder's
        index. Returns how many were removed. Every document: :meth:`clear`."""
        if ids is None:
            raise TwoTowerError("delete: give the ids to remove (removing every document is clear())")
        ids = list(dict.fromkeys(check_ids(ids, "delete")))
        with self.lock:
            if self.index is None:
                return 0
            present = _present(self.index.store, ids)
            if not present:
                return 0
            if len(present) < len(self.index):
                self.index.remove(present)
            else:
                self.clear()
            return len(present)

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
            present = _present(store, check_ids(ids, "get"))
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

    def best_vectors(self, ids: list[str], query) -> np.ndarray:
        """For each document of ``ids``, the stored vector of its passage that scores best for ``query`` (a vector
        as :meth:`projected` gives it): a document of one vector, that vector. As float32, one row per id."""
        with self.lock:
            store = self.index.store
            if store.multivector:
                raise TwoTowerError("maximal marginal relevance needs one vector per document or passage; this index "
                                    "is multi-vector")
            rows = np.array([[store.row_of[i] for i in ids]], dtype=np.int64)
            q = np.asarray(query, dtype=np.float32)[None, :]
            if getattr(store, "passages", None) and hasattr(store, "passage_table"):  # Milvus: a row per passage
                from twotower.retrieval.milvus.passages import best_passage_vectors

                return best_passage_vectors(store, q, rows)[0]
            if getattr(store, "passages", None):  # a local index: the passage rows of each document
                from twotower.retrieval.passages import best_vector_rows

                rows = best_vector_rows(store, q, rows)
            return store.float_vectors(rows[0])


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
