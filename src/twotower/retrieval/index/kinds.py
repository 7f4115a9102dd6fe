"""FAISS index kinds: flat | hnsw | ivf | ivfpq or a factory string, checked before any encoding,
built, trained, filled, and searched with per-call parameters."""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
from twotower.progress import progress_bar

from twotower.checks import check_number, flag, given
from twotower.retrieval.bm25 import BM25Params
from twotower.retrieval.index import codecs
from twotower.retrieval.index.errors import IndexStoreError

log = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivf", "ivfpq")
CHUNK = 65536
PQ_MIN_TRAIN = 256  # FAISS trains each product quantizer's 256 centroids on at least that many vectors
_EXACT_FACTORIES = ("Flat", "IDMap,Flat", "IDMap2,Flat")


def tune_faiss() -> None:
    """Make FAISS use BLAS for batched exact search from 20 queries on (its default, 128000,
    made 200 × 100k exact search 15× slower on these machines)."""
    import faiss

    faiss.cvar.distance_compute_blas_threshold = 20


@dataclass(frozen=True)
class IndexSpec:
    """How to build the FAISS index. ``kind`` is flat | hnsw | ivf | ivfpq or a FAISS factory string.

    ``vectors`` (fp32 | fp16 | int8 | binary), ``dim`` (keep the first ``dim`` dimensions, re-normalised),
    ``rescore`` (binary: int8 | fp32 | none; default int8) and ``rescore_factor`` (binary: k × factor
    Hamming candidates are rescored) say how the vectors are stored: :mod:`twotower.retrieval.index.codecs`."""

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    nlist: int | None = None  # IVF lists; default ≈ 4·√n, at most n / 39 (FAISS's training minimum)
    pq_m: int | None = None  # IVF-PQ sub-quantizers; default: dim / 8 rounded to a divisor of dim
    train_size: int = 200_000  # vectors sampled to train IVF / PQ
    bm25: bool = False
    bm25_params: BM25Params = field(default_factory=BM25Params)
    vectors: str = "fp32"
    dim: int | None = None
    rescore: str | None = None
    rescore_factor: int = codecs.DEFAULT_RESCORE_FACTOR

    @property
    def binary(self) -> bool:
        return self.vectors == "binary"

    def factory(self, dim: int, n: int) -> str:
        """The FAISS factory string for ``n`` vectors of ``dim`` (stored) dimensions."""
        kind = self.kind.lower()
        if self.binary:
            return codecs.binary_factory(kind, self.hnsw_m)
        if kind == "flat":
            return codecs.sq_factory(self.vectors, "Flat")
        if kind == "hnsw":
            return codecs.sq_factory(self.vectors, f"HNSW{self.hnsw_m}")
        if kind in ("ivf", "ivfpq"):
            nlist = self.nlist or max(1, min(int(4 * math.sqrt(max(n, 1))), max(1, n // 39)))
            if kind == "ivf":
                return codecs.sq_factory(self.vectors, f"IVF{nlist},Flat")
            pq_m = self.pq_m or _largest_divisor_at_most(dim, max(1, dim // 8))
            if dim % pq_m:
                raise IndexStoreError(f"IVF-PQ: {given('pq_m', pq_m)} must divide the vector dimension {dim}")
            return f"IVF{nlist},PQ{pq_m}"
        return self.kind  # any FAISS factory string


def is_exact(factory: str) -> bool:
    """Whether a FAISS index of this factory string scores every vector exactly (no ANN)."""
    return factory.replace(" ", "") in _EXACT_FACTORIES


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0)


def _faiss_message(exc: RuntimeError) -> str:
    line = str(exc).strip().splitlines()[-1]
    return re.sub(r"^Error in .*? at \S+:\d+: ", "", line)


def _make(spec: IndexSpec, dim: int, n: int):
    import faiss

    factory = spec.factory(dim, n)
    try:
        if spec.binary:
            return faiss.index_binary_factory(dim, factory), factory
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.try_extract_index_ivf(index) if spec.vectors == "int8" else None
        if ivf is not None:
            ivf.by_residual = False  # the codes hold the vectors themselves, in the corpus's calibration ranges
        return index, factory
    except RuntimeError as exc:
        raise IndexStoreError(
            f"FAISS cannot build index kind '{spec.kind}' (factory '{factory}', {dim}-d vectors): {_faiss_message(exc)}"
            f" (use {flag('kind')} flat, hnsw, ivf, ivfpq or a valid FAISS factory string)"
        ) from None


def check_spec(spec: IndexSpec, dim: int, min_vectors: int, max_vectors: int | None = None) -> str:
    """Fail now, before any encoding, if ``spec`` cannot index ``min_vectors``…``max_vectors`` vectors of
    ``dim`` dimensions (the encoder's; ``spec.dim`` may keep fewer) (a multi-vector corpus's count is known
    only after encoding: pass both bounds). Returns the factory string for ``min_vectors``."""
    max_vectors = min_vectors if max_vectors is None else max_vectors
    dim = codecs.check_vectors(vectors=spec.vectors, dim=spec.dim, rescore=spec.rescore,
                               rescore_factor=spec.rescore_factor, kind=spec.kind, source_dim=dim,
                               multivector=max_vectors != min_vectors)
    least_values = (("hnsw_m", spec.hnsw_m, 2), ("ef_construction", spec.ef_construction, 1),
                    ("nlist", spec.nlist, 1), ("pq_m", spec.pq_m, 1), ("train_size", spec.train_size, 1))
    for name, value, least in least_values:
        check_number(value, name, integer=True, minimum=least, maximum=1 << 24, optional=True)
    if min_vectors < 1:
        raise IndexStoreError("an index needs at least one document")
    if not isinstance(spec.kind, str):
        raise IndexStoreError(f"kind {spec.kind!r}: flat | hnsw | ivf | ivfpq or a FAISS factory string")
    kind = spec.kind.lower()
    defaults = IndexSpec()
    for name in ("hnsw_m", "ef_construction"):  # read by kind hnsw only: elsewhere a value would go unused
        if getattr(spec, name) != getattr(defaults, name) and kind != "hnsw":
            raise IndexStoreError(f"{flag(name)} applies to {flag('kind')} hnsw, not '{spec.kind}': drop it or change "
                                  f"{flag('kind')}")
    if spec.nlist is not None and kind not in ("ivf", "ivfpq"):
        raise IndexStoreError(f"{flag('nlist')} applies to {flag('kind')} ivf | ivfpq, not '{spec.kind}': drop it or "
                              f"change {flag('kind')}")
    if spec.pq_m is not None and kind != "ivfpq":
        raise IndexStoreError(f"{flag('pq_m')} applies to {flag('kind')} ivfpq, not '{spec.kind}': drop it or change "
                              f"{flag('kind')}")
    index, factory = _make(spec, dim, min_vectors)
    if spec.binary:
        return factory
    ivf = _ivf(index)
    if ivf is not None and ivf.nlist > max_vectors:
        raise IndexStoreError(
            f"index kind '{spec.kind}' ({factory}): {given('nlist', ivf.nlist)} is more than the {max_vectors} vectors "
            f"to index; IVF trains one centroid per list on the vectors (use {given('nlist', max_vectors)} or fewer, "
            f"or {given('kind', 'flat')})"
        )
    if "PQ" in factory and max_vectors < PQ_MIN_TRAIN:
        raise _too_few_for_pq(spec, factory, max_vectors)
    return factory


def _too_few_for_pq(spec: IndexSpec, factory: str, n: int) -> IndexStoreError:
    return IndexStoreError(
        f"index kind '{spec.kind}' ({factory}) needs at least {PQ_MIN_TRAIN} vectors to train its product "
        f"quantizer, got {n} (use {flag('kind')} flat or ivf for small collections)"
    )


def _ivf(index):
    import faiss

    return faiss.try_extract_index_ivf(index)


def new_faiss_index(spec: IndexSpec, vectors: np.ndarray, *, show_progress: bool,
                    calibration: np.ndarray | None = None):
    """A FAISS inner-product index for ``spec``, trained on (a sample of) ``vectors``, empty (binary: a
    Hamming index over ``vectors``' dimension in bits). An int8 index's scalar quantizer takes the ranges
    ``calibration`` (2, dim), computed from the whole corpus, instead of those of the training sample."""
    n, dim = vectors.shape
    index, factory = _make(spec, dim, n)
    if spec.binary:
        if hasattr(index, "hnsw"):
            index.hnsw.efConstruction = spec.ef_construction
        return index, factory
    hnsw = find(index, "IndexHNSW")
    if hnsw is not None:
        hnsw.hnsw.efConstruction = spec.ef_construction
    if not index.is_trained:
        if "PQ" in factory and n < PQ_MIN_TRAIN:
            raise _too_few_for_pq(spec, factory, n)
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, spec.train_size), replace=False))
        log.info("training %s on %d vectors", factory, len(sample))
        t0 = time.perf_counter()
        try:
            index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
        except RuntimeError as exc:
            raise IndexStoreError(
                f"FAISS could not train '{factory}' on {len(sample)} vectors: {_faiss_message(exc)}"
            ) from None
        log.info("trained in %.1fs", time.perf_counter() - t0)
    if spec.vectors == "int8":
        codecs.set_ranges(scalar_quantizer_of(index), calibration)
    return index, factory


def scalar_quantizer_of(index):
    """The ``ScalarQuantizer`` inside an SQ index (flat, HNSW storage or IVF)."""
    import faiss

    current = faiss.downcast_index(index)
    if hasattr(current, "storage") and current.storage is not None:  # IndexHNSWSQ
        current = faiss.downcast_index(current.storage)
    ivf = faiss.try_extract_index_ivf(current)
    return (faiss.downcast_index(ivf) if ivf is not None else current).sq


def add_binary(index, bits: np.ndarray) -> None:
    for s in range(0, len(bits), CHUNK):
        index.add(np.ascontiguousarray(bits[s : s + CHUNK], dtype=np.uint8))


def add_in_chunks(index, vectors: np.ndarray, *, show_progress: bool, desc: str = "indexing") -> None:
    with progress_bar(total=len(vectors), desc=desc, unit="vec", disable=not show_progress or len(vectors) < CHUNK) as bar:
        for s in range(0, len(vectors), CHUNK):
            block = np.ascontiguousarray(vectors[s : s + CHUNK], dtype=np.float32)
            index.add(block)
            bar.update(len(block))


def find(index, class_prefix: str):
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


MAX_EF = 4096  # the widest efSearch a filtered search widens to


def widened(base: int, share: float, cap: int = MAX_EF) -> int:
    """An ANN search breadth (HNSW's efSearch, IVF's nprobe) for a filter letting ``share`` of the documents through:
    ``base`` divided by the share, at least ``base``, at most ``cap``."""
    return int(min(cap, max(base, math.ceil(base / share))))


def search_params(index, *, ef_search: int | None = None, nprobe: int | None = None):
    """Per-call FAISS search parameters (thread-safe: the shared index is not mutated)."""
    import faiss

    if ef_search is None and nprobe is None:
        return None
    params = None
    if ef_search is not None:
        if find(index, "IndexHNSW") is None:
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
