"""A persistent, versioned index directory: vectors, documents, a FAISS index, optional BM25.

Layout of an index directory ``INDEX``::

    INDEX/CURRENT                  the name of the live version ("v000003"), replaced atomically
    INDEX/.lock                    writers hold an exclusive flock on it (one writer at a time)
    INDEX/versions/v000003/
        manifest.json              format, model, dim, kind, factory, counts, sizes + sha256 of every file
        vectors.npy                float32 (num_vectors, dim), memory-mapped on load
        offsets.npy                int64 (num_docs + 1): document i owns vectors[offsets[i]:offsets[i+1]]
                                   (multi-vector indexes only; single-vector: row i is document i)
        projection.npy             optional (hidden, dim) projection applied to queries (multi-vector)
        doc_ids.json               document ids in row order
        docs.jsonl, docs.offsets.npy  {"_id", "title", "text"} per row, and each line's byte offset
        faiss.index                the ANN / exact index over the vectors (ids = vector rows)
        bm25/                      optional bm25s index (``twotower.retrieval.bm25.BM25.save``)

Every write (``build``, ``add``, ``remove``) fills a fresh ``versions/.tmp-*`` directory, fsyncs it,
renames it to the next ``vNNNNNN`` and only then replaces ``CURRENT`` (temp file + ``os.replace``).
A crash or SIGKILL at any point leaves ``CURRENT`` naming the previous, complete version. Versions
are immutable once written, so a reader holding an :class:`IndexStore` keeps a consistent
snapshot while a writer works: it sees the old version or, after :meth:`IndexStore.refresh`, the
new one — never a mix. The previous ``keep`` versions stay on disk for readers that opened them.

``add`` encodes only the new documents (the GTR/ADE freshness argument) and adds their vectors to
a copy of the FAISS index; replacing or removing documents rebuilds the FAISS index from the
stored vectors, re-using its trained quantizer. Either way the vector file is rewritten into the
new version (a sequential copy, much cheaper than re-encoding).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import mmap
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from twotower.errors import DataError, TwoTowerError
from twotower.io import atomic_write_json, atomic_write_text, file_digest
from twotower.retrieval.bm25 import BM25, BM25Params

log = logging.getLogger(__name__)

FORMAT = "twotower-index"
FORMAT_VERSION = 1
KINDS = ("flat", "hnsw", "ivf", "ivfpq")
CHUNK = 65536


class IndexStoreError(TwoTowerError):
    """An index directory that cannot be read or written as asked."""


class UnknownIdError(IndexStoreError):
    """Document ids that the index does not hold."""


class DimensionError(IndexStoreError):
    """Vectors whose dimension differs from the index's."""


def tune_faiss() -> None:
    """Make FAISS use BLAS for batched exact search from 20 queries on (its default, 128000,
    made 200 × 100k exact search 15× slower on these machines)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = 20


# --------------------------------------------------------------------------------------------
# index kinds


@dataclass(frozen=True)
class IndexSpec:
    """How to build the FAISS index. ``kind`` is flat | hnsw | ivf | ivfpq or a FAISS factory string."""

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    nlist: int | None = None  # IVF lists; default ≈ 4·√n, at most n / 39 (FAISS's training minimum)
    pq_m: int | None = None  # IVF-PQ sub-quantizers; default: dim / 8 rounded to a divisor of dim
    train_size: int = 200_000  # vectors sampled to train IVF / PQ
    bm25: bool = False
    bm25_params: BM25Params = field(default_factory=BM25Params)

    def factory(self, dim: int, n: int) -> str:
        kind = self.kind.lower()
        if kind == "flat":
            return "Flat"
        if kind == "hnsw":
            return f"HNSW{self.hnsw_m}"
        if kind in ("ivf", "ivfpq"):
            nlist = self.nlist or max(1, min(int(4 * math.sqrt(max(n, 1))), max(1, n // 39)))
            if kind == "ivf":
                return f"IVF{nlist},Flat"
            pq_m = self.pq_m or _largest_divisor_at_most(dim, max(1, dim // 8))
            if dim % pq_m:
                raise IndexStoreError(f"IVF-PQ: pq_m {pq_m} must divide the vector dimension {dim}")
            return f"IVF{nlist},PQ{pq_m}"
        return self.kind  # any FAISS factory string


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0)


def _new_faiss_index(spec: IndexSpec, vectors: np.ndarray, *, show_progress: bool):
    """A FAISS inner-product index for ``spec``, trained on (a sample of) ``vectors``, empty."""
    import faiss

    n, dim = vectors.shape
    factory = spec.factory(dim, n)
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise IndexStoreError(
            f"FAISS cannot build index kind '{spec.kind}' (factory '{factory}'): {str(exc).strip().splitlines()[-1]}"
            f" (use flat, hnsw, ivf, ivfpq or a valid FAISS factory string)"
        ) from None
    hnsw = _find(index, "IndexHNSW")
    if hnsw is not None:
        hnsw.hnsw.efConstruction = spec.ef_construction
    if not index.is_trained:
        if "PQ" in factory and n < 256:
            raise IndexStoreError(
                f"index kind '{spec.kind}' ({factory}) needs at least 256 vectors to train its product "
                f"quantizer, got {n} (use --kind flat or ivf for small collections)"
            )
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, spec.train_size), replace=False))
        log.info("training %s on %d vectors", factory, len(sample))
        t0 = time.perf_counter()
        try:
            index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
        except RuntimeError as exc:
            raise IndexStoreError(f"FAISS could not train '{factory}' on {len(sample)} vectors: {exc}") from None
        log.info("trained in %.1fs", time.perf_counter() - t0)
    return index, factory


def _add_in_chunks(index, vectors: np.ndarray, *, show_progress: bool, desc: str = "indexing") -> None:
    with tqdm(total=len(vectors), desc=desc, unit="vec", disable=not show_progress or len(vectors) < CHUNK) as bar:
        for s in range(0, len(vectors), CHUNK):
            block = np.ascontiguousarray(vectors[s : s + CHUNK], dtype=np.float32)
            index.add(block)
            bar.update(len(block))


def _find(index, class_prefix: str):
    """The first index of a class named ``class_prefix*`` in a (pre-transform) chain, downcast."""
    import faiss

    current = faiss.downcast_index(index)
    while current is not None:
        if type(current).__name__.startswith(class_prefix):
            return current
        if isinstance(current, faiss.IndexPreTransform):
            current = faiss.downcast_index(current.index)
        else:
            return None
    return None


def search_params(index, *, ef_search: int | None = None, nprobe: int | None = None):
    """Per-call FAISS search parameters (thread-safe: the shared index is not mutated)."""
    import faiss

    if ef_search is None and nprobe is None:
        return None
    params = None
    if ef_search is not None:
        if _find(index, "IndexHNSW") is None:
            raise IndexStoreError(f"efSearch applies to HNSW indexes; this index is {type(faiss.downcast_index(index)).__name__}")
        params = faiss.SearchParametersHNSW(efSearch=int(ef_search))
    if nprobe is not None:
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is None:
            raise IndexStoreError(f"nprobe applies to IVF indexes; this index is {type(faiss.downcast_index(index)).__name__}")
        params = faiss.SearchParametersIVF(nprobe=int(nprobe))
    if isinstance(faiss.downcast_index(index), faiss.IndexPreTransform):
        params = faiss.SearchParametersPreTransform(index_params=params)
    return params


# --------------------------------------------------------------------------------------------
# files


def _fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_npy(path: Path, array: np.ndarray) -> None:
    np.save(path, array)


@contextlib.contextmanager
def _writer_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass
class NewDocs:
    """Documents to put into an index, with their vectors.

    Single-vector: ``vectors`` is (n, dim). Multi-vector: ``offsets`` (n + 1) says which rows of
    ``vectors`` belong to each document.
    """

    ids: list[str]
    titles: list[str]
    texts: list[str]
    vectors: np.ndarray
    offsets: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not (len(self.ids) == len(self.titles) == len(self.texts)):
            raise ValueError(f"{len(self.ids)} ids, {len(self.titles)} titles, {len(self.texts)} texts")
        if self.vectors.ndim != 2:
            raise DimensionError(f"vectors must be a 2-d array (rows, dim), got shape {self.vectors.shape}")
        expected = len(self.ids) if self.offsets is None else int(self.offsets[-1])
        if self.offsets is not None and len(self.offsets) != len(self.ids) + 1:
            raise ValueError(f"offsets must have {len(self.ids) + 1} entries, got {len(self.offsets)}")
        if len(self.vectors) != expected:
            raise ValueError(f"{len(self.ids)} documents need {expected} vectors, got {len(self.vectors)}")
        seen: set[str] = set()
        for doc_id in self.ids:
            if doc_id in seen:
                raise IndexStoreError(f"duplicate document id '{doc_id}' among the new documents")
            seen.add(doc_id)


# --------------------------------------------------------------------------------------------
# the store

_REQUIRED = {
    "format": str, "format_version": int, "version": int, "dim": int, "kind": str, "factory": str,
    "num_docs": int, "num_vectors": int, "model": dict, "files": dict,
}


class IndexStore:
    """One immutable version of an index directory, opened for reading.

    Open with :meth:`open`; write with :meth:`build` (new or replacing content), :meth:`add` and
    :meth:`remove`, which return the new version's store and leave this one usable.
    """

    def __init__(self, root: Path, version_dir: Path, manifest: dict, *, verify: bool = False) -> None:
        self.root = root
        self.dir = version_dir
        self.manifest = manifest
        self._check_files(verify)
        self.vectors: np.ndarray = np.load(version_dir / "vectors.npy", mmap_mode="r")
        if self.vectors.shape != (manifest["num_vectors"], manifest["dim"]) or self.vectors.dtype != np.float32:
            raise self._corrupt(
                f"vectors.npy holds {self.vectors.dtype} {self.vectors.shape}, the manifest says float32 "
                f"({manifest['num_vectors']}, {manifest['dim']})", "num_vectors"
            )
        self.doc_ids: list[str] = json.loads((version_dir / "doc_ids.json").read_text())
        if len(self.doc_ids) != manifest["num_docs"]:
            raise self._corrupt(f"doc_ids.json holds {len(self.doc_ids)} ids, the manifest says {manifest['num_docs']}", "num_docs")
        self.row_of: dict[str, int] = {d: i for i, d in enumerate(self.doc_ids)}
        self.offsets: np.ndarray | None = (
            np.load(version_dir / "offsets.npy") if (version_dir / "offsets.npy").is_file() else None
        )
        self.projection: np.ndarray | None = (
            np.load(version_dir / "projection.npy") if (version_dir / "projection.npy").is_file() else None
        )
        self._doc_offsets = np.load(version_dir / "docs.offsets.npy", mmap_mode="r")
        self._docs_file = (version_dir / "docs.jsonl").open("rb")
        self._docs_map = mmap.mmap(self._docs_file.fileno(), 0, access=mmap.ACCESS_READ) if self._docs_file.seek(0, 2) else None
        self._faiss = None
        self._bm25: BM25 | None = None

    # ---- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | Path, *, verify: bool = False) -> "IndexStore":
        """Open the live version of ``root``. ``verify=True`` also checks every file's sha256."""
        root = Path(root)
        for attempt in range(3):
            version = cls._current(root)
            version_dir = root / "versions" / version
            try:
                manifest = cls._read_manifest(version_dir / "manifest.json")
                return cls(root, version_dir, manifest, verify=verify)
            except FileNotFoundError:
                if attempt == 2 or cls._current(root) == version:
                    raise IndexStoreError(
                        f"{version_dir}: the version named by {root / 'CURRENT'} is missing files "
                        f"(restore the directory or rebuild with 'twotower index build')"
                    ) from None
                # a writer switched versions and cleaned up between our reads: try the new one
        raise AssertionError("unreachable")

    @staticmethod
    def _current(root: Path) -> str:
        if not root.is_dir():
            raise IndexStoreError(f"{root}: index directory not found (build one with 'twotower index build')")
        try:
            name = (root / "CURRENT").read_text().strip()
        except FileNotFoundError:
            raise IndexStoreError(
                f"{root}: not an index directory (no CURRENT file; build one with 'twotower index build')"
            ) from None
        if not name.startswith("v") or not name[1:].isdigit():
            raise DataError(root / "CURRENT", f"expected a version name like 'v000001', got {name[:40]!r}",
                            line=1, hint="restore the file or rebuild the index")
        return name

    @staticmethod
    def _read_manifest(path: Path) -> dict:
        text = path.read_text(encoding="utf-8", errors="replace")  # FileNotFoundError propagates
        try:
            manifest = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(path, f"corrupt manifest: {exc.msg} at column {exc.colno}", line=exc.lineno,
                            hint="restore the file or rebuild the index with 'twotower index build'") from None
        if not isinstance(manifest, dict):
            raise DataError(path, f"corrupt manifest: expected a JSON object, got {type(manifest).__name__}",
                            hint="restore the file or rebuild the index")
        for name, typ in _REQUIRED.items():
            if name not in manifest:
                raise DataError(path, "corrupt manifest: missing field", field=name,
                                hint="restore the file or rebuild the index")
            if not isinstance(manifest[name], typ) or isinstance(manifest[name], bool):
                raise DataError(path, f"corrupt manifest: expected {typ.__name__}, got {type(manifest[name]).__name__}",
                                field=name, hint="restore the file or rebuild the index")
        if manifest["format"] != FORMAT:
            raise DataError(path, f"not a twotower index manifest (format {manifest['format']!r})", field="format")
        if manifest["format_version"] > FORMAT_VERSION:
            raise DataError(path, f"index format {manifest['format_version']} is newer than this twotower "
                                  f"understands ({FORMAT_VERSION})", field="format_version", hint="upgrade twotower")
        return manifest

    def _corrupt(self, message: str, field_name: str | None = None) -> DataError:
        return DataError(self.dir / "manifest.json", f"index does not match its manifest: {message}",
                         field=field_name, hint="restore the index directory or rebuild it")

    def _check_files(self, verify: bool) -> None:
        for name, info in self.manifest["files"].items():
            path = self.dir / name
            if not path.is_file():
                raise self._corrupt(f"{name} is missing", "files")
            size = path.stat().st_size
            if size != info.get("bytes"):
                raise self._corrupt(f"{name} has {size} bytes, expected {info.get('bytes')}", "files")
            if verify and file_digest(path) != info.get("sha256"):
                raise self._corrupt(f"{name} fails its sha256 checksum", "files")

    def refresh(self) -> "IndexStore":
        """This store if it is still the live version, else the live version newly opened."""
        if self._current(self.root) == self.dir.name:
            return self
        return IndexStore.open(self.root)

    def close(self) -> None:
        if self._docs_map is not None:
            self._docs_map.close()
        self._docs_file.close()

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

    def __len__(self) -> int:
        return len(self.doc_ids)

    def rows(self, ids: Sequence[str]) -> list[int]:
        """Row numbers of ``ids``; unknown ids are an :class:`UnknownIdError` naming them."""
        missing = [d for d in ids if d not in self.row_of]
        if missing:
            shown = ", ".join(repr(d) for d in missing[:5]) + (" …" if len(missing) > 5 else "")
            raise UnknownIdError(
                f"{self.root}: {len(missing)} document id(s) not in the index (version {self.version}): {shown}"
            )
        return [self.row_of[d] for d in ids]

    def document(self, row: int) -> dict:
        """``{"_id", "title", "text"}`` of the document in ``row`` (read from the mapped docs.jsonl)."""
        start, end = int(self._doc_offsets[row]), int(self._doc_offsets[row + 1])
        return json.loads(self._docs_map[start:end])

    def documents(self, ids: Sequence[str]) -> list[dict]:
        return [self.document(r) for r in self.rows(ids)]

    def doc_vectors(self, row: int) -> np.ndarray:
        """The vector(s) of the document in ``row``: (1, dim) or (m', dim) for multi-vector."""
        if self.offsets is None:
            return np.asarray(self.vectors[row : row + 1])
        return np.asarray(self.vectors[self.offsets[row] : self.offsets[row + 1]])

    def vectors_for(self, ids: Sequence[str]) -> list[np.ndarray]:
        return [self.doc_vectors(r) for r in self.rows(ids)]

    @property
    def faiss_index(self):
        if self._faiss is None:
            import faiss

            path = str(self.dir / "faiss.index")
            try:
                self._faiss = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
            except RuntimeError:
                self._faiss = faiss.read_index(path)
            if self._faiss.ntotal != self.manifest["num_vectors"]:
                raise self._corrupt(f"faiss.index holds {self._faiss.ntotal} vectors, expected "
                                    f"{self.manifest['num_vectors']}", "num_vectors")
        return self._faiss

    @property
    def bm25(self) -> BM25:
        if self._bm25 is None:
            if not self.manifest.get("bm25"):
                raise IndexStoreError(f"{self.root}: this index has no BM25 part (rebuild with --bm25)")
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
        if queries.shape[1] != self.dim:
            raise DimensionError(
                f"query vectors have dimension {queries.shape[1]} but the index at {self.root} holds "
                f"{self.dim}-d vectors (model {self.manifest['model'].get('name')}); encode with the index's model"
            )
        return queries

    def search(
        self, queries: np.ndarray, k: int = 10, *, ef_search: int | None = None, nprobe: int | None = None,
        candidates: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents by inner product: ``(scores, rows)``, each (n_queries, k), best first.

        Missing hits (fewer than ``k`` documents) have row -1 and score -inf. For a multi-vector
        index the FAISS hits (``candidates`` entries, default k·m) are reduced to documents and the
        documents re-scored exactly: score = max over the document's vectors.
        """
        tune_faiss()
        q = self.project_queries(queries)
        index = self.faiss_index
        params = search_params(index, ef_search=ef_search, nprobe=nprobe)
        k = max(1, k)
        if self.offsets is None:
            scores, rows = index.search(q, min(k, max(1, index.ntotal)), params=params)
            return _pad(scores, rows, k)
        from twotower.retrieval.multivector import reduce_to_documents

        m = self.multivector or 1
        n_entries = min(index.ntotal, candidates or k * m)
        _, entries = index.search(q, max(1, n_entries), params=params)
        return reduce_to_documents(q, entries, self.vectors, self.offsets, k)

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
    ) -> "IndexStore":
        """Write ``docs`` as a new version of the index at ``root`` (created if missing).

        An existing index at ``root`` stays live until the new version is complete. ``model``
        describes the encoder (``name``, ``path``, pooling, lengths) so that queries and added
        documents are encoded the same way.
        """
        root = Path(root)
        spec = spec or IndexSpec()
        if root.exists() and any(root.iterdir()) and not (root / "CURRENT").exists() and not (root / "versions").exists():
            raise IndexStoreError(f"{root}: exists and is not an index directory; choose an empty or new --out")
        with _writer_lock(root):
            return _write_version(
                root, previous=None, keep_mask=None, new=docs, model=model, spec=spec, multivector=multivector,
                projection=projection, keep=keep, show_progress=show_progress,
            )

    def add(self, docs: NewDocs, *, replace: bool = False, keep: int = 2, show_progress: bool = True) -> "IndexStore":
        """A new version with ``docs`` added. Ids already in the index are an error unless ``replace``."""
        with _writer_lock(self.root):
            live = self.refresh()  # another writer may have moved on since this store was opened
            if docs.vectors.shape[1] != live.dim:
                raise DimensionError(
                    f"new vectors have dimension {docs.vectors.shape[1]} but the index at {live.root} holds "
                    f"{live.dim}-d vectors (model {live.manifest['model'].get('name')}); encode with the index's model"
                )
            if (docs.offsets is None) != (live.offsets is None):
                raise IndexStoreError(
                    f"{live.root}: the index is {'multi' if live.offsets is not None else 'single'}-vector and "
                    f"the new documents are not; encode them the same way"
                )
            dup = [d for d in docs.ids if d in live.row_of]
            if dup and not replace:
                shown = ", ".join(repr(d) for d in dup[:5]) + (" …" if len(dup) > 5 else "")
                raise IndexStoreError(
                    f"{live.root}: {len(dup)} document id(s) are already in the index: {shown} "
                    f"(pass replace=True / --replace to overwrite them)"
                )
            keep_mask = np.ones(len(live), dtype=bool)
            if dup:
                keep_mask[[live.row_of[d] for d in dup]] = False
            return _write_version(
                live.root, previous=live, keep_mask=keep_mask, new=docs, model=live.manifest["model"],
                spec=live._spec(), multivector=live.multivector, projection=live.projection, keep=keep,
                show_progress=show_progress,
            )

    def remove(self, ids: Sequence[str], *, keep: int = 2, show_progress: bool = True) -> "IndexStore":
        """A new version without ``ids`` (unknown ids are an error)."""
        with _writer_lock(self.root):
            live = self.refresh()
            keep_mask = np.ones(len(live), dtype=bool)
            keep_mask[live.rows(list(ids))] = False
            return _write_version(
                live.root, previous=live, keep_mask=keep_mask, new=None, model=live.manifest["model"],
                spec=live._spec(), multivector=live.multivector, projection=live.projection, keep=keep,
                show_progress=show_progress,
            )

    def _spec(self) -> IndexSpec:
        saved = self.manifest.get("spec") or {}
        bm25 = self.manifest.get("bm25")
        return IndexSpec(
            kind=self.manifest["kind"], hnsw_m=saved.get("hnsw_m", 32), ef_construction=saved.get("ef_construction", 200),
            nlist=saved.get("nlist"), pq_m=saved.get("pq_m"), train_size=saved.get("train_size", 200_000),
            bm25=bool(bm25), bm25_params=BM25Params.from_dict(bm25) if bm25 else BM25Params(),
        )


def _pad(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    if scores.shape[1] < k:
        extra = k - scores.shape[1]
        scores = np.pad(scores, ((0, 0), (0, extra)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, extra)), constant_values=-1)
    return scores, rows


def _version_number(name: str) -> int | None:
    return int(name[1:]) if name.startswith("v") and name[1:].isdigit() else None


def _write_version(
    root: Path,
    *,
    previous: IndexStore | None,
    keep_mask: np.ndarray | None,
    new: NewDocs | None,
    model: dict,
    spec: IndexSpec,
    multivector: int | None,
    projection: np.ndarray | None,
    keep: int,
    show_progress: bool,
) -> IndexStore:
    """Write a complete version into a temp dir, rename it into place, then switch CURRENT."""
    versions = root / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    for stale in versions.glob(".tmp-*"):  # left by a writer that was killed (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = versions / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        manifest = _fill_version(tmp, previous, keep_mask, new, model, spec, multivector, projection, show_progress)
        numbers = [n for n in (_version_number(p.name) for p in versions.iterdir()) if n is not None]
        number = max(numbers, default=0) + 1
        manifest["version"] = number
        atomic_write_json(tmp / "manifest.json", manifest)
        _fsync_dir(tmp)
        final = versions / f"v{number:06d}"
        os.rename(tmp, final)
        _fsync_dir(versions)
        atomic_write_text(root / "CURRENT", final.name + "\n")
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _collect_garbage(versions, final.name, keep)
    log.info("%s: version %s live (%d documents)", root, final.name, manifest["num_docs"])
    return IndexStore(root, final, manifest)


def _collect_garbage(versions: Path, current: str, keep: int) -> None:
    """Delete versions other than ``current`` and the ``keep`` before it (readers may hold those)."""
    cur = _version_number(current)
    older = sorted(n for n in (_version_number(p.name) for p in versions.iterdir()) if n is not None and n != cur)
    keep_set = {n for n in older if n < cur}
    keep_set = set(sorted(keep_set)[-keep:]) if keep > 0 else set()
    for n in older:
        if n not in keep_set:
            shutil.rmtree(versions / f"v{n:06d}", ignore_errors=True)


def _fill_version(
    out: Path,
    previous: IndexStore | None,
    keep_mask: np.ndarray | None,
    new: NewDocs | None,
    model: dict,
    spec: IndexSpec,
    multivector: int | None,
    projection: np.ndarray | None,
    show_progress: bool,
) -> dict:
    """Write every file of a version into ``out`` and return its manifest (without ``version``)."""
    import faiss

    new_dim = new.vectors.shape[1] if new is not None else None
    dim = previous.dim if previous is not None else new_dim
    if previous is None and new is None:
        raise ValueError("nothing to write")
    if new is not None and new_dim != dim:
        raise DimensionError(f"new vectors have dimension {new_dim}, the index holds {dim}-d vectors")

    # which old documents stay, and how many vectors each has
    old_rows = np.flatnonzero(keep_mask) if previous is not None else np.empty(0, dtype=np.int64)
    if previous is not None and previous.offsets is not None:
        old_counts = np.diff(previous.offsets)[old_rows]
    else:
        old_counts = np.ones(len(old_rows), dtype=np.int64)
    new_counts = (
        np.diff(new.offsets) if new is not None and new.offsets is not None
        else np.ones(len(new.ids) if new is not None else 0, dtype=np.int64)
    )
    counts = np.concatenate([old_counts, new_counts]).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    num_vectors = int(offsets[-1])
    num_docs = len(counts)
    if num_docs == 0:
        raise IndexStoreError("an index needs at least one document")

    # vectors: kept old rows (copied in chunks from the memory map), then the new ones
    vec_path = out / "vectors.npy"
    vectors = np.lib.format.open_memmap(vec_path, mode="w+", dtype=np.float32, shape=(num_vectors, dim))
    pos = 0
    if previous is not None and len(old_rows):
        if previous.offsets is None:
            for s in range(0, len(old_rows), CHUNK):
                block = old_rows[s : s + CHUNK]
                vectors[pos : pos + len(block)] = previous.vectors[block]
                pos += len(block)
        elif keep_mask.all():
            vectors[: previous.vectors.shape[0]] = previous.vectors
            pos = previous.vectors.shape[0]
        else:
            for r in old_rows:
                a, b = previous.offsets[r], previous.offsets[r + 1]
                vectors[pos : pos + (b - a)] = previous.vectors[a:b]
                pos += b - a
    if new is not None:
        vectors[pos:] = new.vectors
    vectors.flush()
    del vectors
    vectors = np.load(vec_path, mmap_mode="r")

    # documents
    ids: list[str] = []
    line_offsets = [0]
    with (out / "docs.jsonl").open("wb") as handle:
        if previous is not None:
            for r in old_rows:
                start, end = int(previous._doc_offsets[r]), int(previous._doc_offsets[r + 1])
                handle.write(previous._docs_map[start:end])
                line_offsets.append(line_offsets[-1] + end - start)
                ids.append(previous.doc_ids[r])
        if new is not None:
            for doc_id, title, text in zip(new.ids, new.titles, new.texts):
                line = (json.dumps({"_id": doc_id, "title": title, "text": text}, ensure_ascii=False) + "\n").encode()
                handle.write(line)
                line_offsets.append(line_offsets[-1] + len(line))
                ids.append(doc_id)
        handle.flush()
        os.fsync(handle.fileno())
    _save_npy(out / "docs.offsets.npy", np.asarray(line_offsets, dtype=np.int64))
    (out / "doc_ids.json").write_text(json.dumps(ids, ensure_ascii=False))
    if multivector is not None:
        _save_npy(out / "offsets.npy", offsets)
    if projection is not None:
        _save_npy(out / "projection.npy", np.asarray(projection, dtype=np.float32))

    # FAISS: add to a copy of the previous index when nothing was dropped, else rebuild
    t0 = time.perf_counter()
    if previous is not None and keep_mask.all():
        index = faiss.clone_index(_readable(previous))
        factory = previous.manifest["factory"]
        if new is not None:
            _add_in_chunks(index, new.vectors, show_progress=show_progress, desc="indexing new vectors")
    elif previous is not None:
        index = faiss.clone_index(_readable(previous))
        index.reset()  # keeps the trained quantizer / codebooks
        factory = previous.manifest["factory"]
        _add_in_chunks(index, vectors, show_progress=show_progress)
    else:
        index, factory = _new_faiss_index(spec, vectors, show_progress=show_progress)
        _add_in_chunks(index, vectors, show_progress=show_progress)
    faiss.write_index(index, str(out / "faiss.index"))
    faiss_s = time.perf_counter() - t0

    # BM25 over title + text of every document (bm25s indexes are rebuilt, not appended to)
    bm25_manifest = None
    if spec.bm25:
        texts = []
        with (out / "docs.jsonl").open("rb") as handle:
            for line in handle:
                d = json.loads(line)
                texts.append(f"{d['title']} {d['text']}".strip() if d["title"] else d["text"])
        bm25 = BM25(spec.bm25_params).index(ids, texts, show_progress=show_progress)
        bm25.save(out / "bm25")
        bm25_manifest = asdict(bm25.params)  # language "auto" recorded as the one detected

    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        _fsync_file(path)
        files[str(path.relative_to(out))] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    for sub in sorted(p for p in out.rglob("*") if p.is_dir()):
        _fsync_dir(sub)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": 0,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "dim": int(dim),
        "kind": spec.kind,
        "factory": factory,
        "metric": "inner_product",
        "spec": {"hnsw_m": spec.hnsw_m, "ef_construction": spec.ef_construction, "nlist": spec.nlist,
                 "pq_m": spec.pq_m, "train_size": spec.train_size},
        "num_docs": num_docs,
        "num_vectors": num_vectors,
        "multivector": multivector,
        "bm25": bm25_manifest,
        "faiss_build_s": round(faiss_s, 3),
        "files": files,
    }


def _readable(store: IndexStore):
    """The previous FAISS index loaded fully in memory (a memory-mapped one cannot be cloned and grown)."""
    import faiss

    return faiss.read_index(str(store.dir / "faiss.index"))
