"""Queries in, ranked documents out, over a stored index: dense | bm25 | hybrid | rrf, with PRF and metadata filters.

The queries are encoded with the encoder that built the index (the manifest's ``model``, re-loaded by
:func:`twotower.retrieval.indexing.load_encoder`, which builds and adds documents), so the vectors stay comparable.
:class:`Searcher` holds one immutable version of a store (local or Milvus: the
:class:`~twotower.retrieval.store_protocol.Store` protocol, opened by :func:`~twotower.retrieval.backends.open_store`);
:meth:`Searcher.refresh` swaps in the live version after a writer switched it (one attribute
assignment, so concurrent readers see the old or the new version, never a mix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twotower.checks import flag, given
from twotower.errors import TwoTowerError
from twotower.retrieval.hybrid import NORMS, fusion_depth, interpolate, rrf
from twotower.retrieval.prf import DEFAULT_WEIGHT, check_prf
from twotower.retrieval.backends import open_store
from twotower.retrieval.indexing import load_encoder
from twotower.retrieval.store_protocol import Store

MODES = ("dense", "bm25", "hybrid", "rrf")
# λ for hybrid = λ·dense + (1 − λ)·BM25 (min-max normalised, union of the 100-bests): tuned on a
# held-out half of SciFact *train* queries by benchmarks/hybrid_scifact.py (default model). A top-k
# deeper than HYBRID_N_BEST fuses each side's top-k instead (hybrid.fusion_depth).
DEFAULT_LAMBDA = 0.5
HYBRID_N_BEST = 100


def filter_mask(store, filter) -> np.ndarray | None:
    """The row mask of ``filter`` (a dict, JSON text or parsed :class:`~twotower.retrieval.filters.Filter`) over
    ``store``'s version, or None for no filter (``None`` / ``{}``); checked before any encoding."""
    from twotower.retrieval.filters import parse_filter

    flt = parse_filter(filter)
    if flt.empty:
        return None
    from twotower.retrieval.filters.columns import columns_of

    return flt.mask(columns_of(store))


def restriction(store, filter) -> dict:
    """The keyword arguments that restrict ``store``'s searches (dense and ``bm25``) to the documents ``filter``
    lets through: ``{}`` for no filter, ``{"mask": rows}`` on a local index (:func:`filter_mask`), ``{"expr": ...}``
    on a Milvus index (the filter as a Milvus expression, :meth:`MilvusStore.filter_expression`). Checked before
    any encoding."""
    if hasattr(store, "filter_expression"):
        from twotower.retrieval.filters import parse_filter

        expr = store.filter_expression(parse_filter(filter))
        return {"expr": expr} if expr else {}
    mask = filter_mask(store, filter)
    return {} if mask is None else {"mask": mask}


def index_dim(store) -> int:
    """The size of the vectors queries are encoded to for ``store`` (before any ``dim`` cut of the stored ones)."""
    return int((store.manifest.get("vectors") or {}).get("source_dim") or store.manifest["dim"])


def _external(store, embedding, model):
    """The :class:`~twotower.encoders.external.ExternalEncoder` over ``embedding`` for ``store``: an index built
    with an embedding of your own (or precomputed vectors), checked against what its manifest records."""
    from twotower.encoders.external import ExternalEncoder, is_external

    info = store.manifest.get("model") or {}
    if not is_external(info):
        raise TwoTowerError(f"embedding: {store.root} was built with the twotower encoder {info.get('name')}; an "
                            "embedding of your own would rank noise against its vectors (leave embedding out)")
    if model:
        raise TwoTowerError("give embedding or model, not both")
    return ExternalEncoder(embedding, dim=index_dim(store), normalize=bool(info["embedding"].get("normalize", True)),
                           record=info)


class _TowerQueries:
    """``encode_queries``: a loaded model's query prefix, then its ONNX Runtime tower."""

    def __init__(self, tower, encoder) -> None:
        self.tower, self.encoder = tower, encoder

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self.tower.encode(self.encoder.query_texts(queries))


@dataclass
class Hit:
    doc_id: str
    score: float
    title: str


class Searcher:
    """Queries against a stored index; safe to share between threads that only search."""

    def __init__(
        self, index: str | Path | Store, *, model: str | None = None, query_runtime: str = "torch",
        precision: str = "auto", device: str = "auto", embedding=None,
    ) -> None:
        """``query_runtime``: ``torch``, ``onnx`` or ``auto`` (see :mod:`twotower.encoders.onnx_runtime`);
        ONNX Runtime pays a few seconds of export once and then encodes single queries ~2× faster (in fp32).
        ``precision`` (``auto`` | ``fp32`` | ``bf16``) is the torch query path's; ``device`` its device (auto:
        the GPU where there is one; ONNX Runtime runs on the CPU only, so ``auto`` keeps torch on a GPU).
        ``embedding``: the embedding of your own an index was built with (:mod:`twotower.encoders.external`),
        checked against the manifest's record."""
        self.store = open_store(index) if isinstance(index, (str, Path)) else index
        self.query_vectors = None  # set for one run: the queries' vectors, given (Index.search(query_vector=))
        if model:  # another encoder's queries against these vectors rank noise: refused before any loading
            from twotower.retrieval.index.encoder_check import check_index_encoder

            check_index_encoder(self.store.root, self.store.manifest.get("model") or {}, model)
        self._model_override = model
        self._encoder = None
        if embedding is not None:
            self._encoder = _external(self.store, embedding, model)
        self.query_runtime = query_runtime
        self.precision = precision
        self.device = device
        self._onnx_queries: object = False  # False: not resolved yet; None: torch
        self._defaults: object = False  # False: not read yet

    @property
    def defaults(self):
        """The retrieval choices stored with the index's model (``twotower fit``: retrieval/defaults.py), or None."""
        if self._defaults is False:
            from twotower.retrieval.defaults import read_defaults

            self._defaults = read_defaults(self._model_override or self.store.manifest["model"].get("path"))
        return self._defaults

    def resolve(self, mode: str | None, lam: float | None) -> tuple[str, float]:
        """(mode, λ) to search with: the given ones, else the model's fitted ones, else hybrid where the index has
        BM25 (it won on every English collection measured: docs/guides/hybrid-prf-rerank.md) or dense, and
        DEFAULT_LAMBDA."""
        d = self.defaults
        mode = mode or (d.mode if d else "hybrid" if self.store.manifest.get("bm25") else "dense")
        if lam is None:
            lam = d.lam if d is not None and d.lam is not None and mode == "hybrid" else DEFAULT_LAMBDA
        return mode, lam

    @property
    def encoder(self):
        if self._encoder is None:
            self._encoder = load_encoder(self.store.manifest["model"], self._model_override, self.device)
        return self._encoder

    def refresh(self) -> bool:
        """Switch to the live version if a writer made a new one; True when it changed."""
        live = self.store.refresh()
        changed = live is not self.store
        self.store = live
        return changed

    @property
    def onnx_queries(self):
        """The ONNX Runtime query encoder (``encode_queries(texts)``) when ``query_runtime`` resolves to onnx, else
        None: from the on-disk cache when it holds this model (no torch, no weights loaded:
        :mod:`twotower.encoders.onnx_cache`), else exported from the loaded query tower (and cached)."""
        if self._onnx_queries is False and (self.query_runtime == "torch" or (
                self._encoder is not None and hasattr(self._encoder, "manifest_info"))):
            self._onnx_queries = None  # torch asked for, or an embedding of your own encodes its queries
        if self._onnx_queries is False:
            self._onnx_queries = self._cached_queries()
        if self._onnx_queries is False:
            if hasattr(self.encoder, "manifest_info"):  # precomputed vectors: no query tower
                self._onnx_queries = None
                return None
            from twotower.encoders.onnx_runtime import query_runtime

            tower = query_runtime(self.encoder.query_tower, self.query_runtime,
                                  max_length=self.encoder.query_max_length)
            self._onnx_queries = None if tower is None else _TowerQueries(tower, self.encoder)
            if tower is not None and self._model_dir() is not None:
                from twotower.encoders.onnx_cache import save_cached

                save_cached(self._model_dir(), query_max_length=self.encoder.query_max_length,
                            model_bytes=tower.model_bytes, prefix=self.encoder.prompts.get("query", ""),
                            dim=tower.dim, probes=tower.probes)
        return self._onnx_queries

    def _model_dir(self) -> str | None:
        """The local directory of the index's twotower model (None: an embedding of your own, a hub name)."""
        from twotower.encoders.external import is_external

        info = self.store.manifest.get("model") or {}
        if is_external(info):
            return None
        path = self._model_override or info.get("path")
        if path is None and info.get("name") in (None, "all-MiniLM-L6-v2"):
            from twotower.encoders.layout import default_model_path

            path = str(default_model_path())
        return path if path and Path(path).is_dir() else None

    def _cached_queries(self):
        """The cached ONNX query encoder (False: none usable here, so the tower is loaded)."""
        model_dir = self._model_dir()
        length = (self.store.manifest.get("model") or {}).get("query_max_length")
        # device auto on a machine with an NVIDIA driver may mean a GPU: torch decides there (imported only then)
        gpu = self.device not in ("auto", "cpu") or (self.device == "auto" and
                                                     Path("/proc/driver/nvidia/version").exists())
        if self._encoder is not None or model_dir is None or not length or self._model_override or gpu:
            return False
        from twotower.encoders.onnx_cache import load_cached

        return load_cached(model_dir, query_max_length=int(length)) or False

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        if self.query_vectors is not None:
            from twotower.encoders.external import check_vectors, is_external

            info = self.store.manifest.get("model") or {}
            normalize = bool(info["embedding"].get("normalize", True)) if is_external(info) else False
            return check_vectors(self.query_vectors, len(queries), "query_vector", index_dim(self.store),
                                 normalize=normalize)
        if self.onnx_queries is not None:
            return self.onnx_queries.encode_queries(queries)
        from twotower.encoders.towers import EncodeOptions

        return self.encoder.encode_queries(queries, EncodeOptions(precision=self.precision, show_progress=False))

    def run(
        self, queries: dict[str, str], k: int = 10, *, mode: str | None = None, lam: float | None = None,
        n_best: int = HYBRID_N_BEST, ef_search: int | None = None, nprobe: int | None = None,
        store: Store | None = None, norm: str | None = None, prf_depth: int | None = None,
        prf_weight: float | None = None, filter=None, query_vectors: np.ndarray | None = None,
    ) -> dict[str, dict[str, float]]:
        """A run ``{query_id: {doc_id: score}}`` for ``queries`` (``{query_id: text}``), all from one
        index version (``store``, default the live one when the call starts): each query's ``k`` best
        (fewer only when fewer documents score). ``hybrid`` and ``rrf`` fuse each side's
        ``max(k, n_best)``-best. ``mode`` / ``lam`` / ``norm`` (the hybrid's normalisation) left out: the model's
        fitted choices (:meth:`resolve`; min-max when it has none). ``prf_depth``: the dense side searches again
        after Rocchio feedback from its ``prf_depth`` best, weighted by ``prf_weight`` (default
        ``prf.DEFAULT_WEIGHT``; ``retrieval.prf``; single-vector indexes). ``filter``: a metadata filter
        (:mod:`twotower.retrieval.filters`): every side searches only the documents it lets through, so each query
        gets the ``k`` best matching documents (PRF's feedback comes from matching documents too).
        ``query_vectors``: the queries already encoded (:meth:`encode_queries`), so a caller that needs them too
        (a hit's best passage) encodes once. An index of passages scores a document by its best passage."""
        mode, lam = self.resolve(mode, lam)
        if mode not in MODES:
            raise TwoTowerError(f"unknown search mode '{mode}': choose one of {', '.join(MODES)}")
        norm = norm or (self.defaults.norm if self.defaults is not None else None) or "minmax"
        if norm not in NORMS:
            raise TwoTowerError(f"unknown fusion normalisation '{norm}': choose one of {', '.join(NORMS)}")
        check_prf(prf_depth, prf_weight, mode=mode)
        store = store or self.store  # one version for the whole call
        # no query has more hits than the index has documents: a k of 2**31 - 1 asks for no array that size
        k = min(int(k), max(1, len(store)))
        only = restriction(store, filter)
        qids, texts = list(queries), list(queries.values())
        if "mask" in only and not only["mask"].any():  # nothing matches: no hits (and no encoding)
            return {q: {} for q in qids}
        depth = k if mode in ("dense", "bm25") else fusion_depth(k, n_best)
        runs = {}
        if mode != "bm25":
            q_vecs = self.encode_queries(texts) if query_vectors is None else query_vectors
            if prf_depth:
                q_vecs = self._feedback(store, q_vecs, prf_depth, DEFAULT_WEIGHT if prf_weight is None else prf_weight,
                                        ef_search, nprobe, only)
            scores, rows = store.search(q_vecs, depth, ef_search=ef_search, nprobe=nprobe, **only)
            runs["dense"] = {q: {store.doc_ids[r]: float(s) for s, r in zip(rs, rr) if r >= 0}
                             for q, rs, rr in zip(qids, scores, rows)}
        if mode != "dense":
            from twotower.retrieval.bm25 import matching_run

            scores, rows = store.bm25.search(texts, depth, show_progress=False, **only)
            runs["bm25"] = matching_run(qids, store.doc_ids, scores, rows)  # no document that matches nothing
        if mode in ("dense", "bm25"):
            return runs[mode]
        if mode == "hybrid":
            return interpolate(runs["dense"], runs["bm25"], lam, n_best=depth, top_k=k, norm=norm)
        return rrf([runs["dense"], runs["bm25"]], n_best=depth, top_k=k)

    @staticmethod
    def _feedback(store: Store, q_vecs: np.ndarray, depth: int, weight: float, ef_search, nprobe,
                  only: dict | None = None) -> np.ndarray:
        """Query vectors moved toward their ``depth`` best documents' stored vectors (retrieval.prf.rocchio)."""
        from twotower.retrieval.prf import feedback_rows, rocchio

        if store.multivector:
            raise TwoTowerError(f"pseudo-relevance feedback ({flag('prf_depth')}) needs one vector per document; this "
                                f"index is multi-vector: drop {flag('prf_depth')}")
        q_vecs = store.project_queries(q_vecs)  # at the stored dimension (index build --dim)
        only = only or {}
        if not only and depth > len(store):  # refused before a search sized by it (the service says the same)
            raise TwoTowerError(f"{given('prf_depth', depth)}: the index holds only {len(store)} documents to feed "
                                f"back; lower {flag('prf_depth')}")
        if only:  # feedback from the matching documents, as many as there are up to depth
            matches = int(only["mask"].sum()) if "mask" in only else store.count(only["expr"])
            if matches == 0:  # nothing to learn from (and nothing the search after finds)
                return q_vecs
            depth = min(depth, matches)
        _, rows = store.search(q_vecs, depth, ef_search=ef_search, nprobe=nprobe, **only)
        rows = feedback_rows(rows, depth)
        if getattr(store, "passages", None) and hasattr(store, "passage_table"):  # Milvus: a row per passage
            from twotower.retrieval.milvus.passages import best_passage_vectors

            return rocchio(q_vecs, best_passage_vectors(store, q_vecs, rows), weight)
        if getattr(store, "passages", None):  # a document's vector is its best passage's for this query
            from twotower.retrieval.passages import best_vector_rows

            rows = best_vector_rows(store, q_vecs, rows)
        return rocchio(q_vecs, store.float_vectors(rows), weight)

    def search(self, query: str, k: int = 10, **kwargs) -> list[Hit]:
        """The top ``k`` hits for one query, with titles."""
        store = self.store  # the same version for the ranking and the titles
        ranked = sorted(self.run({"q": query}, k, store=store, **kwargs)["q"].items(), key=lambda kv: -kv[1])[:k]
        if hasattr(store, "prefetch"):  # a Milvus index: the documents in one query, not one each
            store.prefetch([d for d, _ in ranked])
        return [Hit(d, s, store.document(store.row_of[d])["title"]) for d, s in ranked]
