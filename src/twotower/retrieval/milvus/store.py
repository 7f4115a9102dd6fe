"""An index whose vectors, documents and BM25 sparse vectors live in a Milvus collection.

:class:`MilvusStore` implements the :class:`~twotower.retrieval.store_protocol.Store` protocol beside the local
:class:`twotower.retrieval.store.IndexStore` — ``build``, ``open``, ``search``, ``bm25.search``, ``document``,
``documents``, ``row_of``, ``doc_ids``, ``float_vectors`` (PRF), ``add``, ``remove``, ``refresh``, ``info``,
``manifest``, ``version`` — so the Searcher, the API (``tt.Index``) and the service work over it unchanged;
:func:`twotower.retrieval.backends.open_store` opens one when the manifest says ``"backend": "milvus"``.

Rows: Milvus keys documents by id, the Searcher speaks in rows; a store numbers the ids as it meets them
(:mod:`.rows`), so nothing holds the whole id list in memory.

All state lives in Milvus: the documents' rows carry the numbers of the writes that added and removed them, and the
``<collection>__state`` collection holds the committed write's number, the manifest and the BM25 vocabulary
(:mod:`.state`). A store is one committed write (``seq``): every read filters the rows to what that write left
(:func:`.state.visible`), so a search never sees half of a write, and every replica reads the same state.
``refresh`` moves to the latest committed write. The index directory only names the URI and collection (and keeps
copies of the manifest, a cache nobody needs to keep). Writes: :mod:`.writes`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from twotower.checks import switch
from twotower.retrieval.index.errors import DimensionError, IndexStoreError, UnknownIdError
from twotower.retrieval.index.kinds import IndexSpec
from twotower.retrieval.index.lock import writer_lock
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.index.versions import open_live
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus import schema
from twotower.retrieval.milvus.breadth import search_params
from twotower.retrieval.milvus.build import attach_version, build_version, check_options
from twotower.retrieval.milvus.client import client_for, forget_client
from twotower.retrieval.milvus.lexical import SparseBM25
from twotower.retrieval.milvus.passages import check_rows as _check_rows
from twotower.retrieval.milvus.passages import passage_table, search_documents, split_any
from twotower.retrieval.milvus.rows import RowTable, read_visible
from twotower.retrieval.milvus.state import State, documents_visible, visible
from twotower.retrieval.milvus.vectors import MilvusVectors
from twotower.retrieval.milvus.writes import check_sizes, digest, done_before, write, write_version

if TYPE_CHECKING:
    from twotower.retrieval.milvus.lexical_search import MilvusBM25

log = logging.getLogger(__name__)

MAX_TOPK = 16_384  # Milvus' largest limit per search


class _Check:
    """``store.files``: what the Searcher checks before a write (here: that the collection is still this index's)."""

    def __init__(self, store: "MilvusStore") -> None:
        self._store = store

    def check_all(self, *, writing: bool = False, skip=()) -> None:
        schema.check_owner(self._store.client, self._store.manifest, self._store.root)

    def close(self) -> None:
        pass


class MilvusStore:
    """One version of a Milvus-backed index directory, opened (see the module's docstring)."""

    backend = "milvus"
    offsets = None  # single-vector only
    projection = None

    def __init__(self, root: Path, version_dir: Path, manifest: dict, *, check: bool = True,
                 head: dict | None = None) -> None:
        self.root = Path(root)
        self.dir = version_dir
        m = manifest["milvus"]
        self.uri, self.collection = m["uri"], m["collection"]
        self.client = client_for(self.uri, f"{version_dir / 'manifest.json'}: milvus.uri")
        if check:
            schema.check_owner(self.client, manifest, self.root)
            with self._errors("loading the collection"):
                mc.load_collection(self.client, self.collection, self.uri)
        self.state = State(self.client, self.uri, self.collection)
        if check:
            self.state.load()
        self.head = head if head is not None else self.state.head()
        self.seq = int(self.head["seq"])
        # the engine's manifest, not the folder's (which may be older); the folder's way to the server
        self.manifest = dict(self.head["manifest"], files=manifest.get("files", {}), milvus=m)
        self.kind = MilvusVectors.from_manifest(self.manifest)  # how the vectors are stored
        self.doc_ids: list[str] = []
        self.row_of = RowTable(self)
        self.files = _Check(self)
        self._docs: OrderedDict[str, dict] = OrderedDict()  # recently read documents
        self._docs_lock = threading.Lock()
        self._lexicon: SparseBM25 | None = None

    def _errors(self, what: str):
        return mc.milvus_errors(self.uri, self.collection, what)

    # ---- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | Path) -> "MilvusStore":
        root = Path(root)
        return open_live(root, lambda version_dir, manifest: cls(root, version_dir, manifest))

    @classmethod
    def build(cls, root: str | Path, docs: NewDocs, *, model: dict, spec=None, uri: str | None = None,
              collection: str | None = None, keep: int = 2, show_progress: bool = True,
              passages: dict | None = None) -> "MilvusStore":
        """Fill a collection (``collection`` at ``uri``; defaults: :mod:`.client`) with ``docs`` and publish the
        index folder ``root`` naming it; a rebuild of ``root`` into its own collection drops and re-fills it.
        ``spec``: an :class:`~twotower.retrieval.index.kinds.IndexSpec` (kind flat / hnsw / ivf, BM25);
        ``passages``: the :class:`~twotower.encoders.passages.PassageSpec` entry ``docs`` were split by (their
        ``offsets`` and ``spans``): a row per passage."""
        root, spec = Path(root), spec or IndexSpec()
        _check_rows(root, docs, passages)
        uri, collection, index, client = check_options(root, spec, uri=uri, collection=collection,
                                                       num_docs=len(docs.ids))
        final, manifest = build_version(root, docs, model=model, spec=spec, uri=uri, collection=collection,
                                        index=index, client=client, keep=keep, show_progress=show_progress, passages=passages)
        return cls(root, final, manifest, check=False)

    @classmethod
    def attach(cls, root: str | Path, uri: str, collection: str) -> "MilvusStore":
        """An index folder at ``root`` (new or empty) for the Milvus index in ``collection`` at ``uri``, made from what
        Milvus holds alone (:func:`.build.attach_version`), opened."""
        final, manifest = attach_version(root, uri, collection)
        return cls(Path(root), final, manifest)

    def refresh(self) -> "MilvusStore":
        """The store of the latest committed write (``self`` when there was none since)."""
        if not self.state.changed_since(self.seq):
            return self
        head = self.state.head()
        return MilvusStore(self.root, self.dir, self.manifest, check=False, head=head)

    def close(self) -> None:
        pass

    # ---- facts --------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return f"v{self.seq:06d}"

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def multivector(self) -> None:
        return None

    @property
    def passages(self) -> dict | None:
        """How long documents are split (a PassageSpec's entry; a row per passage: :mod:`.passages`), or None."""
        return self.manifest.get("passages")

    def __len__(self) -> int:
        return int(self.manifest["num_docs"])

    def info(self) -> dict:
        """The manifest (the engine's), with ``backend`` and ``live_version`` (binary: without the int8 ranges, a
        list of 2 × dim numbers)."""
        vectors = {k: v for k, v in (self.manifest.get("vectors") or {}).items() if k != "calibration"}
        return {**self.manifest, "vectors": vectors, "backend": "milvus", "live_version": self.version}

    def count(self, expr: str = "") -> int:
        """The number of documents Milvus holds now (those ``expr``, a Milvus expression, selects)."""
        with self._errors("counting documents"):
            rows = self.client.query(self.collection, filter=self._doc_rows_where(expr), output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def _visible(self, expr: str = "") -> str:
        """This write's rows (:func:`.state.visible`), and of those the ones ``expr`` selects."""
        return f"({visible(self.head)}) and ({expr})" if expr else visible(self.head)

    def _doc_rows_where(self, expr: str = "") -> str:
        """:meth:`_visible`'s rows, but one per document (its own row, not its further passages')."""
        return f"({documents_visible(self.head)}) and ({expr})" if expr else documents_visible(self.head)

    def filter_expression(self, flt) -> str:
        """The Milvus expression of a metadata filter (a parsed :class:`~twotower.retrieval.filters.Filter`) on this
        index, ``""`` for none; a condition Milvus would answer differently from the local index is refused
        (:mod:`.filtering`)."""
        from twotower.retrieval.milvus.filtering import milvus_filter
        from twotower.retrieval.milvus.writes import METADATA_KINDS

        return milvus_filter(flt, self.manifest.get(METADATA_KINDS) or {})

    # ---- documents ----------------------------------------------------------------------

    def _query(self, ids: Sequence[str], fields: list[str]) -> dict[str, dict]:
        """The visible rows of ``ids`` with ``fields``, by id (batched: :func:`.rows.read_visible`)."""
        return read_visible(self, ids, fields)

    def existing(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` that the collection holds."""
        return set(self._query(ids, ["id"]))

    def rows(self, ids: Sequence[str]) -> list[int]:
        """The rows of ``ids`` (unknown ids are an error): the ids this store met already from memory, the others in
        batched queries."""
        known = self.row_of.known(ids)
        missing = [d for d in ids if d not in known]
        if missing:
            shown = ", ".join(repr(d) for d in missing[:5]) + (" …" if len(missing) > 5 else "")
            raise UnknownIdError(f"{self.root}: {len(missing)} document id(s) not in the index (Milvus collection "
                                 f"'{self.collection}'): {shown}")
        return [self.row_of.intern(d) for d in ids]

    def document(self, row: int) -> dict:
        """``{"_id", "title", "text"}`` of the document in ``row``, with ``"metadata"`` when it has some (read from
        Milvus, recent ones cached)."""
        return self._documents([self.doc_ids[row]])[0]

    def _documents(self, ids: Sequence[str]) -> list[dict]:
        """The documents ``ids`` (cached ones from the cache, the others in batched queries)."""
        with self._docs_lock:
            cached = {d: self._docs[d] for d in ids if d in self._docs}
        wanted = [d for d in dict.fromkeys(ids) if d not in cached]
        if wanted:
            found = self._query(wanted, ["title", "text", mc.METADATA])
            missing = [d for d in wanted if d not in found]
            if missing:
                raise UnknownIdError(f"{self.root}: document '{missing[0]}' is no longer in the Milvus collection "
                                     f"'{self.collection}' (removed meanwhile)")
            for doc_id in wanted:
                e = found[doc_id]
                doc = {"_id": doc_id, "title": e["title"], "text": e["text"]}
                if e.get(mc.METADATA):  # as the local store: "metadata" only when the document has some
                    doc["metadata"] = e[mc.METADATA]
                cached[doc_id] = doc
            with self._docs_lock:
                for doc_id in wanted:
                    self._docs[doc_id] = cached[doc_id]
                while len(self._docs) > 10_000:
                    self._docs.popitem(last=False)
        return [dict(cached[d]) for d in ids]

    def prefetch(self, ids: Sequence[str]) -> None:
        """Read the documents ``ids`` into the cache in batched queries (the ones still there, each numbered: no error
        for others), so that :meth:`document` and ``row_of`` then ask Milvus nothing."""
        ids = list(dict.fromkeys(ids))
        with self._docs_lock:
            wanted = [d for d in ids if d not in self._docs]
        found = self._query(wanted, ["title", "text", mc.METADATA]) if wanted else {}
        with self._docs_lock:
            for doc_id, e in found.items():
                self.row_of.intern(doc_id)
                doc = {"_id": doc_id, "title": e["title"], "text": e["text"]}
                if e.get(mc.METADATA):
                    doc["metadata"] = e[mc.METADATA]
                self._docs[doc_id] = doc
            while len(self._docs) > max(10_000, len(ids)):
                self._docs.popitem(last=False)

    def document_fields(self, row: int) -> tuple[str, str, str]:
        d = self.document(row)
        return d["_id"], d["title"], d["text"]

    def documents(self, ids: Sequence[str]) -> list[dict]:
        """The documents ``ids`` (unknown ids are an error), in batched queries."""
        ids = list(ids)
        found = self._query(ids, ["title", "text", mc.METADATA])
        missing = [d for d in ids if d not in found]
        if missing:
            shown = ", ".join(repr(d) for d in missing[:5]) + (" …" if len(missing) > 5 else "")
            raise UnknownIdError(f"{self.root}: {len(missing)} document id(s) not in the index (Milvus collection "
                                 f"'{self.collection}'): {shown}")
        out = []
        for doc_id in ids:
            self.row_of.intern(doc_id)
            e = found[doc_id]
            doc = {"_id": doc_id, "title": e["title"], "text": e["text"]}
            if e.get(mc.METADATA):
                doc["metadata"] = e[mc.METADATA]
            out.append(doc)
        return out

    def passage_table(self, rows: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{row: (spans, vectors)}`` of the documents ``rows``' passages (:func:`.passages.passage_table`)."""
        return passage_table(self, rows)

    def float_vectors(self, rows) -> np.ndarray:
        """The stored vectors of ``rows`` (any shape) as float32, shaped ``rows.shape + (dim,)``."""
        rows = np.asarray(rows)
        ids = [self.doc_ids[int(r)] for r in rows.reshape(-1)]
        found = self._query(ids, self.kind.fields)
        missing = [d for d in ids if d not in found]
        if missing:
            raise UnknownIdError(f"{self.root}: document '{missing[0]}' is no longer in the Milvus collection "
                                 f"'{self.collection}' (removed meanwhile)")
        return self.kind.decode([found[d] for d in ids]).reshape(*rows.shape, self.dim)

    def doc_vectors(self, row: int) -> np.ndarray:
        return self.float_vectors(np.asarray([row]))

    def vectors_for(self, ids: Sequence[str]) -> list[np.ndarray]:
        return [self.doc_vectors(r) for r in self.rows(ids)]

    # ---- searching ----------------------------------------------------------------------

    def project_queries(self, queries: np.ndarray) -> np.ndarray:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2:
            raise DimensionError(f"queries must be a 2-d array (n, dim), got shape {queries.shape}")
        if queries.shape[1] != self.dim:
            raise DimensionError(
                f"query vectors have dimension {queries.shape[1]} but the index at {self.root} (Milvus collection "
                f"'{self.collection}') holds {self.dim}-d vectors (model {self.manifest['model'].get('name')}); "
                "encode with the index's model")
        return queries

    def _search_params(self, k: int, ef_search: int | None, nprobe: int | None) -> dict:
        return search_params(self.manifest["milvus"], self.kind.metric, k, ef_search, nprobe)

    def _ranked(self, field: str, data: list, k: int, params: dict, expr: str = "", *, queries=None,
                depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Milvus' top ``k`` of ``field`` for each of ``data`` among the documents ``expr`` (a metadata filter's
        expression, :meth:`filter_expression`) selects: (scores, rows), -inf / -1 where fewer. ``queries`` (the
        float32 query vectors of the dense field): the top ``depth`` rows are scored by :meth:`.vectors.MilvusVectors.ranked`
        (binary: rescored) and the best ``k`` kept."""
        if k > MAX_TOPK:
            raise IndexStoreError(f"k {k}: Milvus returns at most {MAX_TOPK} hits per query; ask for fewer")
        scores = np.full((len(data), k), -np.inf, dtype=np.float32)
        rows = np.full((len(data), k), -1, dtype=np.int64)
        asked = [i for i, d in enumerate(data) if not (isinstance(d, dict) and not d)]  # {}: a query of no known term
        with self._errors("searching"):
            for start in range(0, len(asked), 64):
                chunk = asked[start:start + 64]
                hits = self.client.search(self.collection, data=[data[i] for i in chunk], anns_field=field,
                                          limit=min(MAX_TOPK, depth or k), search_params=params,
                                          output_fields=["id", *(self.kind.fields[1:] if queries is not None else [])],
                                          filter=self._visible(expr))
                for i, found in zip(chunk, hits):
                    ranked = (self.kind.ranked(found, queries[i]) if queries is not None else
                              [(h["entity"], float(h["distance"])) for h in found])
                    for j, (entity, score) in enumerate(ranked[:k]):
                        scores[i, j] = score
                        rows[i, j] = self.row_of.intern(entity["id"])
        return scores, rows

    def search(self, queries: np.ndarray, k: int = 10, *, ef_search: int | None = None, nprobe: int | None = None,
               candidates: int | None = None, rescore_factor: int | None = None,
               expr: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents by inner product: ``(scores, rows)``, each (n_queries, k), best first; with ``expr``
        (:meth:`filter_expression`) among the documents it selects (Milvus filters before it ranks)."""
        q = self.project_queries(queries)
        k = max(1, k)
        depth = self.kind.depth(k, rescore_factor)
        if split_any(self):  # a document scores as its best passage
            return search_documents(self, q, k, lambda n: self._search_params(n, ef_search, nprobe), expr, depth)
        return self._ranked(mc.DENSE, self.kind.queries(q), k, self._search_params(depth, ef_search, nprobe), expr,
                            queries=q, depth=depth)

    @property
    def lexicon(self) -> SparseBM25:
        if self._lexicon is None:
            if not self.manifest.get("bm25"):
                raise IndexStoreError(f"{self.root}: this index has no BM25 part (rebuild with {switch('bm25')})")
            self._lexicon = self.state.load_lexicon(self.head)
        return self._lexicon

    @property
    def bm25(self) -> "MilvusBM25":
        from twotower.retrieval.milvus.lexical_search import MilvusBM25

        return MilvusBM25(self, self.lexicon)

    # ---- writing ------------------------------------------------------------------------

    def add(self, docs: NewDocs, *, replace: bool = False, keep: int = 2, show_progress: bool = True) -> "MilvusStore":
        """Add ``docs`` (ids already in the index are an error unless ``replace``) as one write that a crash cannot
        half-do (:mod:`.writes`); returns once Milvus holds it durably, the store of the new committed write."""
        _check_rows(self.root, docs, self.passages)
        if docs.vectors.shape[1] != self.dim:
            raise DimensionError(
                f"new vectors have dimension {docs.vectors.shape[1]} but the index at {self.root} (Milvus "
                f"collection '{self.collection}') holds {self.dim}-d vectors (model "
                f"{self.manifest['model'].get('name')}); encode with the index's model")
        check_sizes(docs)
        return self._write(keep, docs=docs, replace=replace, show_progress=show_progress)

    def remove(self, ids: Sequence[str], *, keep: int = 2, show_progress: bool = True) -> "MilvusStore":
        """Delete ``ids`` (unknown ids are an error) as one write; returns once Milvus holds it durably."""
        return self._write(keep, remove=list(ids), show_progress=show_progress)

    def wrote(self, docs: Sequence[tuple[str, str, str, dict]], replace: bool = False) -> bool:
        """Whether a committed write added exactly ``docs`` (``(id, title, text, metadata)``) and they are still there
        as it wrote them (:func:`.writes.done_before`): running it again (after a kill that came after its commit
        point, whatever other writers committed since) is then a no-op, not an "already in the index" error."""
        ids, titles, texts, metadata = (list(x) for x in zip(*docs)) if docs else ([], [], [], [])
        key = digest("add", ids, titles, texts, replace, metadata)
        return done_before(self, self.state, self.state.head(), key, ids, adds=True)

    def _write(self, keep: int, **kwargs) -> "MilvusStore":
        with writer_lock(self.root):
            head = write(self, **kwargs)
            manifest = {k: v for k, v in head["manifest"].items() if k != "files"}
            final = write_version(self.root, manifest, None, keep=keep)  # the folder's copy: a cache
            return MilvusStore(self.root, final, manifest, check=False, head=head)


__all__ = ["MilvusStore", "client_for", "forget_client"]
