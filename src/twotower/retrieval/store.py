"""A persistent, versioned index directory: vectors, documents, a FAISS index, optional BM25.

Layout of an index directory ``INDEX``::

    INDEX/CURRENT                  the name of the live version ("v000003"), replaced atomically
    INDEX/.lock                    writers hold an exclusive flock on it (one writer at a time)
    INDEX/versions/v000003/
        manifest.json              format, model, dim, kind, factory, counts, corpus fingerprint,
                                   sizes + sha256 of every file
        vectors.npy                (num_vectors, dim) float32, or as ``manifest["vectors"]`` says: float16,
                                   uint8 int8 codes, uint8 sign bits (``index.codecs``); memory-mapped
        calibration.npy            int8 storage: per-dimension (min, max) ranges, (2, dim)
        offsets.npy                int64 (num_docs + 1): document i owns vectors[offsets[i]:offsets[i+1]]
                                   (multi-vector and passage indexes; single-vector: row i is document i)
        spans.npy                  int64 (num_vectors, 2): passage indexes only: each vector row's passage as
                                   (start, end) character offsets into its document's text
        projection.npy             optional (hidden, dim) projection applied to queries (multi-vector)
        doc_ids.json               document ids in row order (a JSON list: the format's, read by older versions)
        doc_ids.bin, doc_ids.offsets.npy, doc_ids.lookup.npy
                                   the same ids compactly: UTF-8 bytes, where each starts, sorted hashes ->
                                   rows; memory-mapped by readers (``index.ids``: no Python object per document)
        docs.jsonl, docs.offsets.npy  {"_id", "title", "text"[, "metadata"]} per row (metadata only when the
                                   document has some), and each line's byte offset
        faiss.index                the ANN / exact index over the vectors (ids = vector rows)
        bm25/                      optional bm25s index (``twotower.retrieval.bm25.BM25.save``)

Every write (``build``, ``add``, ``remove``) fills a fresh ``versions/.tmp-*`` directory, fsyncs it,
renames it to the next ``vNNNNNN`` and only then replaces ``CURRENT`` (temp file + ``os.replace``).
A crash or SIGKILL at any point leaves ``CURRENT`` naming the previous, complete version. Versions
are immutable once written, so a reader holding an :class:`IndexStore` keeps a consistent
snapshot while a writer works: it sees the old version or, after :meth:`IndexStore.refresh`, the
new one — never a mix. The previous ``keep`` versions stay on disk, and any older one an open store still holds
(``INDEX/.readers``: :class:`~twotower.retrieval.index.versions.Lease`) until it is closed or dropped, so the parts a
store reads on first use come from its own version too.

``add`` encodes only the new documents (the GTR/ADE freshness argument) and adds their vectors to
a copy of the FAISS index; replacing or removing documents rebuilds the FAISS index from the
stored vectors, re-using its trained quantizer. Either way the vector file is rewritten into the
new version (a sequential copy, much cheaper than re-encoding).

Integrity: opening checks every file's size; the first read of ``vectors.npy`` or ``faiss.index``
through an opened version checks that file's sha256; a write re-checks every file it copies and
refuses to write from corrupt data (:mod:`twotower.retrieval.index.files`).

The parts live in :mod:`twotower.retrieval.index`; their public names are importable from here. This is the local
backend of the :class:`~twotower.retrieval.store_protocol.Store` protocol; :mod:`twotower.retrieval.backends` opens an
index folder with the backend its manifest names (this one, or Milvus).
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from twotower.checks import switch
from twotower.io import load_npy
from twotower.retrieval.bm25 import BM25, BM25Params
from twotower.retrieval.index import codecs, writer
from twotower.retrieval.index.errors import DimensionError, IndexStoreError, UnknownIdError
from twotower.retrieval.index.files import VersionFiles, corrupt
from twotower.retrieval.index.ids import DocIds
from twotower.retrieval.index.kinds import KINDS, IndexSpec, check_spec, search_params, tune_faiss
from twotower.retrieval.index.lock import writer_lock
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.index.search import read_faiss, search_version
from twotower.retrieval.index.versions import (
    FORMAT, FORMAT_VERSION, check_target, current_version, discard_unfinished, hold, open_live,
)

__all__ = [
    "FORMAT", "FORMAT_VERSION", "KINDS", "DimensionError", "IndexSpec", "IndexStore", "IndexStoreError", "NewDocs",
    "UnknownIdError", "check_spec", "check_target", "search_params", "tune_faiss",
]


class IndexStore:
    """One immutable version of an index directory, opened for reading.

    Open with :meth:`open` (an index of either backend: :func:`twotower.retrieval.backends.open_store`); write with
    :meth:`build` (new or replacing content), :meth:`add` and :meth:`remove`, which return the new version's store and
    leave this one usable.
    """

    def __init__(self, root: Path, version_dir: Path, manifest: dict, *, verify: bool = False) -> None:
        self.root = root
        self.dir = version_dir
        self.manifest = manifest
        # held until close: no writer collects this version meanwhile, so the parts read on first use (faiss.index,
        # bm25/, docs.jsonl for filters) come from it too; FileNotFoundError if it is gone already (open_live retries)
        self._lease = hold(version_dir.parent.parent, version_dir.name) if version_dir.parent.name == "versions" else None
        try:
            self._open_files(version_dir, manifest, verify)
        except BaseException:
            if self._lease is not None:
                self._lease.close()
            raise

    def _open_files(self, version_dir: Path, manifest: dict, verify: bool) -> None:
        self.files = VersionFiles(version_dir, manifest)  # sizes checked here, sha256 on first read
        if verify:
            self.files.check_all()
        calibration = (load_npy(version_dir / "calibration.npy") if (version_dir / "calibration.npy").is_file()
                       else None)
        self.codec = codecs.Codec.from_manifest(manifest, calibration)
        if self.codec.needs_calibration and (calibration is None or calibration.shape != (2, self.codec.dim)):
            raise corrupt(version_dir, f"int8 vectors need calibration.npy of shape (2, {self.codec.dim})", "vectors")
        self._vectors: np.ndarray = load_npy(version_dir / "vectors.npy", mmap_mode="r")
        wanted = (manifest["num_vectors"], self.codec.columns)
        if self._vectors.shape != wanted or self._vectors.dtype != self.codec.dtype:
            raise corrupt(
                version_dir, f"vectors.npy holds {self._vectors.dtype} {self._vectors.shape}, the manifest says "
                f"{np.dtype(self.codec.dtype).name} {wanted}", "num_vectors"
            )
        self.doc_ids = DocIds.load(version_dir)  # a sequence of str over memory-mapped bytes (index.ids)
        problem = self.doc_ids.problem()
        if problem or len(self.doc_ids) != manifest["num_docs"]:
            self.doc_ids.close()
            raise corrupt(version_dir, problem or f"the document id files hold {len(self.doc_ids)} ids, the manifest "
                                                  f"says {manifest['num_docs']}", "num_docs")
        self.row_of = self.doc_ids.row_of  # a read-only {id: row}
        self.offsets: np.ndarray | None = (
            load_npy(version_dir / "offsets.npy") if (version_dir / "offsets.npy").is_file() else None
        )
        if self.offsets is not None and not self.multivector and int(self.offsets[-1]) == len(self.offsets) - 1:
            self.offsets = None  # passages, but every document fits one: searched exactly as a one-vector index
        self.spans: np.ndarray | None = (
            load_npy(version_dir / "spans.npy", mmap_mode="r") if (version_dir / "spans.npy").is_file() else None
        )
        self.projection: np.ndarray | None = (
            load_npy(version_dir / "projection.npy") if (version_dir / "projection.npy").is_file() else None
        )
        self._doc_offsets = load_npy(version_dir / "docs.offsets.npy", mmap_mode="r")
        self._docs_file = (version_dir / "docs.jsonl").open("rb")
        self._docs_map = mmap.mmap(self._docs_file.fileno(), 0, access=mmap.ACCESS_READ) if self._docs_file.seek(0, 2) else None
        self._faiss = None
        self._bm25: BM25 | None = None

    # ---- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | Path, *, verify: bool = False) -> "IndexStore":
        """Open the live version of ``root``. ``verify=True`` checks every file's sha256 now (otherwise
        the vectors and the FAISS index are checked on their first read)."""
        root = Path(root)

        def opened(version_dir: Path, manifest: dict) -> "IndexStore":
            if manifest.get("backend", "faiss") != "faiss":
                raise IndexStoreError(
                    f"{root}: a {manifest['backend']} index, not a local one: open it with "
                    "twotower.retrieval.backends.open_store (tt.Index.open does)")
            return cls(root, version_dir, manifest, verify=verify)

        return open_live(root, opened)

    def refresh(self) -> "IndexStore":
        """This store if it is still the live version, else the live version newly opened."""
        if current_version(self.root) == self.dir.name:
            return self
        return IndexStore.open(self.root)

    def close(self) -> None:
        if self._docs_map is not None:
            self._docs_map.close()
        self._docs_file.close()
        self.doc_ids.close()
        self.files.close()
        if self._lease is not None:
            self._lease.close()  # a later write may collect this version now

    # ---- reading ------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.dir.name

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def multivector(self) -> int | None:
        return self.manifest.get("multivector")

    @property
    def passages(self) -> dict | None:
        """The passage spec (``window``, ``overlap``, ``max_passages``) of an index that splits long documents into
        passages (one vector each), or None (one vector per document, or ME-BERT's m)."""
        return self.manifest.get("passages")

    @property
    def vectors(self) -> np.ndarray:
        """The memory-mapped stored vectors (num_vectors, columns) in the stored type (``codec``; float32 for
        fp32 indexes); the first access checks the file's sha256. :meth:`float_vectors` decodes rows."""
        self.files.ensure("vectors.npy")
        return self._vectors

    def float_vectors(self, rows) -> np.ndarray:
        """Stored vectors ``rows`` (an index array of any shape) as float32 (decoded from fp16 / int8 / bits),
        shaped ``rows.shape + (dim,)``."""
        rows = np.asarray(rows)
        flat = self.codec.decode(np.asarray(self.vectors[rows.reshape(-1)]))
        return flat.reshape(*rows.shape, flat.shape[-1])

    def __len__(self) -> int:
        return len(self.doc_ids)

    def existing(self, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` this version holds."""
        return {d for d in ids if d in self.row_of}

    def info(self) -> dict:
        """The manifest, with ``backend`` and ``live_version`` (this version's name)."""
        return {**self.manifest, "backend": "faiss", "live_version": self.version}

    def rows(self, ids: Sequence[str]) -> list[int]:
        """Row numbers of ``ids``; unknown ids are an :class:`UnknownIdError` naming them."""
        rows = self.doc_ids.rows(ids)
        missing = [d for d, r in zip(ids, rows) if r is None]
        if missing:
            shown = ", ".join(repr(d) for d in missing[:5]) + (" …" if len(missing) > 5 else "")
            raise UnknownIdError(
                f"{self.root}: {len(missing)} document id(s) not in the index (version {self.version}): {shown}"
            )
        return rows

    def document_bytes(self, row: int) -> bytes:
        """The line of docs.jsonl that holds the document in ``row`` (newline included)."""
        start, end = int(self._doc_offsets[row]), int(self._doc_offsets[row + 1])
        return self._docs_map[start:end]

    def document(self, row: int) -> dict:
        """``{"_id", "title", "text"}`` of the document in ``row`` (read from the mapped docs.jsonl), with
        ``"metadata"`` when it has some."""
        return json.loads(self.document_bytes(row))

    def metadata(self, row: int) -> dict:
        """The metadata of the document in ``row`` (``{}`` when it has none, as in indexes written before
        metadata existed)."""
        return self.document(row).get("metadata") or {}

    def document_fields(self, row: int) -> tuple[str, str, str]:
        d = self.document(row)
        return d["_id"], d["title"], d["text"]

    def documents(self, ids: Sequence[str]) -> list[dict]:
        return [self.document(r) for r in self.rows(ids)]

    def doc_vectors(self, row: int) -> np.ndarray:
        """The vector(s) of the document in ``row``: (1, dim) or (m', dim) for multi-vector."""
        if self.offsets is None:
            return self.codec.decode(self.vectors[row : row + 1])
        return self.codec.decode(np.asarray(self.vectors[self.offsets[row] : self.offsets[row + 1]]))

    def vectors_for(self, ids: Sequence[str]) -> list[np.ndarray]:
        return [self.doc_vectors(r) for r in self.rows(ids)]

    @property
    def faiss_index(self):
        if self._faiss is None:
            self._faiss = read_faiss(self)
        return self._faiss

    @property
    def bm25(self) -> BM25:
        if self._bm25 is None:
            if not self.manifest.get("bm25"):
                raise IndexStoreError(f"{self.root}: this index has no BM25 part (rebuild with {switch('bm25')})")
            params = BM25Params.from_dict(self.manifest["bm25"])
            self._bm25 = BM25.load(self.dir / "bm25", self.doc_ids, params, mmap=True)
        return self._bm25

    def project_queries(self, queries: np.ndarray) -> np.ndarray:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2:
            raise DimensionError(f"queries must be a 2-d array (n, dim), got shape {queries.shape}")
        if self.projection is not None:
            if queries.shape[1] != self.projection.shape[0]:
                raise DimensionError(
                    f"query vectors have dimension {queries.shape[1]} but the index at {self.root} projects "
                    f"{self.projection.shape[0]}-d queries (model {self.manifest['model'].get('name')})"
                )
            queries = np.ascontiguousarray(queries @ self.projection, dtype=np.float32)
        if queries.shape[1] == self.codec.source_dim != self.dim:
            queries = codecs.truncate(queries, self.dim)  # --dim: cut and re-normalised like the documents
        if queries.shape[1] != self.dim:
            raise DimensionError(
                f"query vectors have dimension {queries.shape[1]} but the index at {self.root} holds "
                f"{self.dim}-d vectors (model {self.manifest['model'].get('name')}); encode with the index's model"
            )
        return queries

    def search(
        self, queries: np.ndarray, k: int = 10, *, ef_search: int | None = None, nprobe: int | None = None,
        candidates: int | None = None, rescore_factor: int | None = None, mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents by inner product: ``(scores, rows)``, each (n_queries, k), best first.

        Missing hits (fewer than ``k`` documents) have row -1 and score -inf. For a multi-vector
        index the FAISS hits (``candidates`` entries, default k·m) are reduced to documents and the
        documents re-scored exactly: score = max over the document's vectors. A binary index takes the
        ``k × rescore_factor`` (default: the manifest's) nearest by Hamming distance and rescores them
        with the float query (``twotower.retrieval.index.binary``). ``mask`` (bool, one per document row: a
        metadata filter's) restricts the search to the documents where it is True
        (``twotower.retrieval.index.filtered``: exact on flat indexes).
        """
        tune_faiss()
        return search_version(self, self.project_queries(queries), k, ef_search=ef_search, nprobe=nprobe,
                              candidates=candidates, rescore_factor=rescore_factor, mask=mask)

    # ---- writing ------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        root: str | Path,
        docs: NewDocs,
        *,
        model: dict,
        spec: IndexSpec | None = None,
        multivector: int | None = None,
        projection: np.ndarray | None = None,
        keep: int = 2,
        show_progress: bool = True,
        passages: dict | None = None,
    ) -> "IndexStore":
        """Write ``docs`` as a new version of the index at ``root`` (created if missing).

        An existing index at ``root`` stays live until the new version is complete; a first build
        that fails leaves ``root`` as it found it. ``model`` describes the encoder (``name``,
        ``path``, pooling, lengths) so that queries and added documents are encoded the same way.
        """
        root = Path(root)
        spec = spec or IndexSpec()
        codecs.check_vectors(vectors=spec.vectors, dim=spec.dim, rescore=spec.rescore,
                             rescore_factor=spec.rescore_factor, kind=spec.kind, source_dim=docs.vectors.shape[1],
                             multivector=multivector is not None)
        check_target(root)
        created = not root.exists()
        first = created or not (root / "CURRENT").exists()
        try:
            with writer_lock(root):
                final, manifest = writer.write_version(
                    root, previous=None, keep_mask=None, new=docs, model=model, spec=spec, multivector=multivector,
                    projection=projection, keep=keep, show_progress=show_progress, passages=passages,
                )
        except BaseException:
            if first:
                discard_unfinished(root, created=created)
            raise
        return cls._written(root, final, manifest)

    @classmethod
    def _written(cls, root: Path, version_dir: Path, manifest: dict) -> "IndexStore":
        store = cls(root, version_dir, manifest)
        store.files.written_now()  # its sums were just computed from these very files
        return store

    def add(self, docs: NewDocs, *, replace: bool = False, keep: int = 2, show_progress: bool = True,
            remove: Sequence[str] = ()) -> "IndexStore":
        """A new version with ``docs`` added. Ids already in the index are an error unless ``replace``. ``remove``:
        ids of other documents the same version leaves out (unknown ids are an error)."""
        with writer_lock(self.root):
            live = self.refresh()  # another writer may have moved on since this store was opened
            if docs.vectors.shape[1] not in (live.dim, live.codec.source_dim):
                raise DimensionError(
                    f"new vectors have dimension {docs.vectors.shape[1]} but the index at {live.root} holds "
                    f"{live.dim}-d vectors (model {live.manifest['model'].get('name')}); encode with the index's model"
                )
            if live.passages is None and (docs.offsets is None) != (live.offsets is None):
                raise IndexStoreError(
                    f"{live.root}: the index is {'multi' if live.offsets is not None else 'single'}-vector and "
                    f"the new documents are not; encode them the same way"
                )
            held = live.doc_ids.rows(docs.ids)
            dup = [d for d, r in zip(docs.ids, held) if r is not None]
            if dup and not replace:
                shown = ", ".join(repr(d) for d in dup[:5]) + (" …" if len(dup) > 5 else "")
                raise IndexStoreError(
                    f"{live.root}: {len(dup)} document id(s) are already in the index: {shown} "
                    f"(pass {switch('replace')} to overwrite them)"
                )
            keep_mask = np.ones(len(live), dtype=bool)
            if dup:
                keep_mask[[r for r in held if r is not None]] = False
            if remove:
                keep_mask[live.rows(list(remove))] = False
            return live._write(keep_mask, docs, keep, show_progress)

    def remove(self, ids: Sequence[str], *, keep: int = 2, show_progress: bool = True) -> "IndexStore":
        """A new version without ``ids`` (unknown ids are an error)."""
        with writer_lock(self.root):
            live = self.refresh()
            keep_mask = np.ones(len(live), dtype=bool)
            keep_mask[live.rows(list(ids))] = False
            return live._write(keep_mask, None, keep, show_progress)

    def _write(self, keep_mask: np.ndarray, docs: NewDocs | None, keep: int, show_progress: bool) -> "IndexStore":
        final, manifest = writer.write_version(
            self.root, previous=self, keep_mask=keep_mask, new=docs, model=self.manifest["model"], spec=self.spec(),
            multivector=self.multivector, projection=self.projection, keep=keep, show_progress=show_progress,
            passages=self.passages,
        )
        return IndexStore._written(self.root, final, manifest)

    def spec(self) -> IndexSpec:
        """The settings this version was written with (what the next write keeps)."""
        saved = self.manifest.get("spec") or {}
        bm25 = self.manifest.get("bm25")
        return IndexSpec(
            kind=self.manifest["kind"], hnsw_m=saved.get("hnsw_m", 32), ef_construction=saved.get("ef_construction", 200),
            nlist=saved.get("nlist"), pq_m=saved.get("pq_m"), train_size=saved.get("train_size", 200_000),
            bm25=bool(bm25), bm25_params=BM25Params.from_dict(bm25) if bm25 else BM25Params(),
            vectors=self.codec.vectors, dim=self.codec.dim if self.codec.dim != self.codec.source_dim else None,
            rescore=self.codec.rescore, rescore_factor=self.codec.rescore_factor,
        )
