"""Text in, ranked documents out, over a stored index: build, add, search (dense | bm25 | hybrid).

The encoder that built an index is recorded in its manifest (``model``: name, path, pooling,
normalisation, lengths) and re-loaded here for queries and for documents added later, so the
vectors stay comparable. :class:`Searcher` holds one immutable version of a store (local or Milvus: the
:class:`~twotower.retrieval.store_protocol.Store` protocol, opened by :func:`~twotower.retrieval.backends.open_store`);
:meth:`Searcher.refresh` swaps in the live version after a writer switched it (one attribute
assignment, so concurrent readers see the old or the new version, never a mix).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from twotower.data.beir import Document, load_corpus
from twotower.checks import flag, given, switch
from twotower.errors import TwoTowerError
from twotower.retrieval.hybrid import NORMS, fusion_depth, interpolate, rrf
from twotower.retrieval.prf import DEFAULT_WEIGHT, check_prf
from twotower.retrieval.backends import open_store
from twotower.retrieval.index.files import REBUILT
from twotower.retrieval.store import IndexSpec, IndexStore, NewDocs, check_spec, check_target
from twotower.retrieval.store_protocol import Store

log = logging.getLogger(__name__)

MODES = ("dense", "bm25", "hybrid", "rrf")
# λ for hybrid = λ·dense + (1 − λ)·BM25 (min-max normalised, union of the 100-bests): tuned on a
# held-out half of SciFact *train* queries by benchmarks/hybrid_scifact.py (default model). A top-k
# deeper than HYBRID_N_BEST fuses each side's top-k instead (hybrid.fusion_depth).
DEFAULT_LAMBDA = 0.5
HYBRID_N_BEST = 100


@dataclass
class EncodeConfig:
    batch_size: int | None = None  # None: the device's default (encoders.inference.DEFAULT_BATCH_SIZE)
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    show_progress: bool = True
    compile: bool = False  # torch.compile single-vector document encoding (EncodeOptions.compile)


def model_info(model_arg: str | None, encoder) -> dict:
    """What the manifest records about the encoder."""
    from twotower.encoders.backbone import resolve_model

    tower = encoder.doc_tower
    path = resolve_model(model_arg)
    if Path(path).exists():  # a local directory: absolute, so the index loads it from any working directory
        path = str(Path(path).resolve())
    return {
        "name": str(model_arg) if model_arg else "all-MiniLM-L6-v2",
        "path": path,
        "pooling": tower.pooling,
        "normalize": bool(tower.normalize),
        "query_max_length": int(encoder.query_max_length),
        "doc_max_length": int(encoder.doc_max_length),
    }


def load_encoder(info: dict, override: str | None = None, device: str = "auto"):
    """The dual encoder an index was built with (or ``override``, a model directory), on ``device``."""
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder

    target = resolve_device(device)
    if override:
        return DualEncoder.load(override, device=target)
    path = info.get("path")
    model = path if path and Path(path).exists() else info.get("name")
    return DualEncoder.load(
        model, pooling=info.get("pooling"), normalize=info.get("normalize"),
        query_max_length=info.get("query_max_length"), doc_max_length=info.get("doc_max_length"), device=target,
    )


def encode_new_docs(
    encoder, docs: list[Document], cfg: EncodeConfig, *, multivector: int | None = None,
    projection: np.ndarray | None = None,
) -> NewDocs:
    from twotower.encoders.towers import EncodeOptions

    texts = [d.full_text for d in docs]
    if multivector:
        from twotower.retrieval.multivector import encode_multivector

        vectors, offsets = encode_multivector(
            encoder.doc_tower, texts, multivector, max_length=encoder.doc_max_length, batch_size=cfg.batch_size,
            precision=cfg.precision, projection=projection, show_progress=cfg.show_progress,
        )
    else:
        opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress,
                             compile=cfg.compile)
        vectors, offsets = encoder.encode_documents(texts, opts), None
    return NewDocs([d.id for d in docs], [d.title for d in docs], [d.text for d in docs], vectors, offsets,
                   metadata=[getattr(d, "metadata", None) or {} for d in docs])


def spec_for_model(spec: IndexSpec, model: str | None, *, language_given: bool = False) -> IndexSpec:
    """``spec`` with a BM25 part when the model was fitted to hybrid or RRF retrieval (``twotower fit``): its
    searches need one; in the fitted BM25 language unless ``language_given`` (the user's --language)."""
    from dataclasses import replace

    from twotower.retrieval.defaults import read_defaults

    fitted = read_defaults(model)
    if fitted is None:
        return spec
    if fitted.language and not language_given and (spec.bm25 or fitted.needs_bm25):
        spec = replace(spec, bm25_params=replace(spec.bm25_params, language=fitted.language))
    if spec.bm25 or not fitted.needs_bm25:
        return spec
    log.info("the model was fitted to %s retrieval: building the BM25 part too", fitted.mode)
    return replace(spec, bm25=True)


def check_build(out: str | Path, spec: IndexSpec, cfg: EncodeConfig, *, dim: int, num_docs: int,
                multivector: int | None = None) -> None:
    """Everything an index build can check before encoding: the output directory, the index kind and
    its options for ``num_docs`` documents of ``dim`` dimensions (up to ``multivector`` vectors each), the
    precision. A failure here costs nothing and writes nothing."""
    from twotower.encoders.inference import check_precision

    check_precision(cfg.precision, f"unknown {flag('precision')}")
    check_target(Path(out))
    check_spec(spec, dim, num_docs, num_docs * multivector if multivector else num_docs)


def build_index(
    data: str | Path,
    out: str | Path,
    *,
    model: str | None = None,
    spec: IndexSpec | None = None,
    multivector: int | None = None,
    project_dim: int | None = None,
    cfg: EncodeConfig | None = None,
    **vector_options,
) -> IndexStore:
    """Encode a BEIR directory's corpus (or a corpus .jsonl file) and write an index at ``out``.
    ``vector_options``: ``vectors``, ``dim``, ``rescore``, ``rescore_factor`` (see :func:`build_index_from`)."""
    from twotower.encoders.device import resolve_device
    from twotower.encoders.towers import DualEncoder

    cfg = cfg or EncodeConfig()
    target = resolve_device(cfg.device)
    data = Path(data)
    check_target(Path(out))  # before loading anything
    corpus = load_corpus(data / "corpus.jsonl" if data.is_dir() else data)
    encoder = DualEncoder.load(model, device=target)
    return build_index_from(list(corpus.values()), out, encoder, model=model, spec=spec, multivector=multivector,
                            project_dim=project_dim, cfg=cfg, **vector_options)


def build_index_from(
    docs: list[Document],
    out: str | Path,
    encoder,
    *,
    model: str | None = None,
    spec: IndexSpec | None = None,
    multivector: int | None = None,
    project_dim: int | None = None,
    cfg: EncodeConfig | None = None,
    vectors: str | None = None,
    dim: int | None = None,
    rescore: str | None = None,
    rescore_factor: int | None = None,
) -> IndexStore:
    """Encode ``docs`` with ``encoder`` (a loaded DualEncoder; ``model``: the name or directory it came from, which
    the manifest records so that searches load it again) and write an index at ``out``.

    ``vectors`` (fp32 | fp16 | int8 | binary), ``dim`` (keep the first ``dim`` dimensions, re-normalised),
    ``rescore`` (binary: int8 | fp32 | none) and ``rescore_factor`` (binary: k × factor Hamming candidates are
    rescored), when given, override ``spec``'s fields of the same names (:mod:`twotower.retrieval.index.codecs`);
    bad values fail before any encoding."""
    from dataclasses import replace as _replace

    cfg = cfg or EncodeConfig()
    spec = spec_for_model(spec or IndexSpec(), model, language_given=spec is not None)  # a given spec: its language
    options = {"vectors": vectors, "dim": dim, "rescore": rescore, "rescore_factor": rescore_factor}
    spec = _replace(spec, **{k: v for k, v in options.items() if v is not None})
    check_target(Path(out))
    if multivector is None and encoder.multivector:
        multivector = int(encoder.multivector)
        log.info("the model was trained with --multivector %d: building a multi-vector index with m=%d", multivector,
                 multivector)
    projection = None
    if project_dim:
        if not multivector:
            raise TwoTowerError(f"{flag('project')} applies to multi-vector indexes ({flag('multivector')} M)")
        from twotower.retrieval.multivector import random_projection

        projection = random_projection(encoder.doc_tower.dim, project_dim)  # token vectors are in the tower's space
    dim = projection.shape[1] if projection is not None else encoder.doc_tower.dim
    check_build(out, spec, cfg, dim=dim, num_docs=len(docs), multivector=multivector)
    new = encode_new_docs(encoder, docs, cfg, multivector=multivector, projection=projection)
    return IndexStore.build(out, new, model=model_info(model, encoder), spec=spec, multivector=multivector,
                            projection=projection, show_progress=cfg.show_progress)


def build_milvus_from(docs: list, out: str | Path, encoder, *, model: str | None, spec, cfg, uri: str | None,
                      collection: str | None) -> Store:
    """Encode ``docs`` (``Document``s) with ``encoder`` and write a Milvus-backed index at ``out``
    (:meth:`~twotower.retrieval.milvus.store.MilvusStore.build`, which checks the options and the documents' sizes
    again before it writes; ``tt.Index.build`` checks the options before it loads the model)."""
    from twotower.encoders.inference import check_precision
    from twotower.retrieval.milvus.store import MilvusStore

    out = Path(out)
    check_precision(cfg.precision, f"unknown {flag('precision')}")
    if not docs:
        raise TwoTowerError("the corpus holds no documents to index")
    if encoder.multivector:
        raise TwoTowerError(f"this model was trained with {flag('multivector')}; a Milvus index holds one vector per "
                            f"document (use {given('backend', 'faiss')})")
    new = encode_new_docs(encoder, docs, cfg)
    return MilvusStore.build(out, new, model=model_info(model, encoder), spec=spec, uri=uri, collection=collection,
                             show_progress=cfg.show_progress)


def add_documents(
    index: str | Path, docs_path: str | Path, *, replace: bool = False, model: str | None = None,
    cfg: EncodeConfig | None = None,
) -> Store:
    """Encode only the documents in ``docs_path`` (BEIR corpus lines) and add them to ``index``."""
    docs = load_corpus(docs_path)
    return add_documents_from(index, list(docs.values()), replace=replace, model=model, cfg=cfg, source=str(docs_path))


def add_documents_from(
    index: str | Path | Store, docs: list[Document], *, replace: bool = False, model: str | None = None,
    cfg: EncodeConfig | None = None, source: str = "documents", encoder=None,
) -> Store:
    """Encode ``docs`` (with ``encoder``, a loaded DualEncoder, or the index's own model) and add them to ``index``
    as a new version; ``source`` names them in errors."""
    cfg = cfg or EncodeConfig()
    store = open_store(index) if isinstance(index, (str, Path)) else index
    index = store.root
    dup = [d.id for d in docs if d.id in store.row_of]
    rerun = getattr(store, "wrote", None)  # a Milvus index: this very write committed before a crash (issue #44)
    if dup and not replace and not (
            rerun and rerun([(d.id, d.title, d.text, getattr(d, "metadata", None) or {}) for d in docs], replace)):
        shown = ", ".join(repr(d) for d in dup[:5]) + (" …" if len(dup) > 5 else "")
        raise TwoTowerError(
            f"{source}: {len(dup)} document id(s) are already in the index {index}: {shown} "
            f"(pass {switch('replace')} to overwrite them)"
        )
    # before spending time encoding: the files a write copies must still match their checksums (the
    # write checks again under the lock)
    store.files.check_all(writing=True, skip=REBUILT)
    from twotower.retrieval.index.encoder_check import check_index_encoder

    info = store.manifest.get("model") or {}
    if encoder is None:  # a --model string: the index's own model or refused (a loaded encoder: its size, below)
        check_index_encoder(index, info, model)
    encoder = encoder or load_encoder(store.manifest["model"], model, cfg.device)
    vectors = store.manifest.get("vectors") or {}
    if not store.multivector:  # the encoder's output size against the stored vectors' (before a projection)
        check_index_encoder(index, info, model, encoder_dim=int(encoder.dim),
                            index_dim=int(vectors.get("source_dim") or store.manifest.get("dim") or encoder.dim))
    new = encode_new_docs(encoder, docs, cfg, multivector=store.multivector, projection=store.projection)
    return store.add(new, replace=replace, show_progress=cfg.show_progress)


def filter_mask(store, filter) -> np.ndarray | None:
    """The row mask of ``filter`` (a dict, JSON text or parsed :class:`~twotower.retrieval.filters.Filter`) over
    ``store``'s version, or None for no filter (``None`` / ``{}``); checked before any encoding."""
    from twotower.retrieval.filters import parse_filter

    flt = parse_filter(filter)
    if flt.empty:
        return None
    from twotower.retrieval.filter_columns import columns_of

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


@dataclass
class Hit:
    doc_id: str
    score: float
    title: str


class Searcher:
    """Queries against a stored index; safe to share between threads that only search."""

    def __init__(
        self, index: str | Path | Store, *, model: str | None = None, query_runtime: str = "torch",
        precision: str = "auto", device: str = "auto",
    ) -> None:
        """``query_runtime``: ``torch``, ``onnx`` or ``auto`` (see :mod:`twotower.encoders.onnx_runtime`);
        ONNX Runtime pays a few seconds of export once and then encodes single queries ~2× faster (in fp32).
        ``precision`` (``auto`` | ``fp32`` | ``bf16``) is the torch query path's; ``device`` its device (auto:
        the GPU where there is one; ONNX Runtime runs on the CPU only, so ``auto`` keeps torch on a GPU)."""
        self.store = open_store(index) if isinstance(index, (str, Path)) else index
        if model:  # another encoder's queries against these vectors rank noise: refused before any loading
            from twotower.retrieval.index.encoder_check import check_index_encoder

            check_index_encoder(self.store.root, self.store.manifest.get("model") or {}, model)
        self._model_override = model
        self._encoder = None
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
        """(mode, λ) to search with: the given ones, else the model's fitted ones, else dense and DEFAULT_LAMBDA."""
        d = self.defaults
        mode = mode or (d.mode if d else "dense")
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
        """The ONNX Runtime query tower when ``query_runtime`` resolves to onnx, else None."""
        if self._onnx_queries is False:
            from twotower.encoders.onnx_runtime import query_runtime

            self._onnx_queries = query_runtime(self.encoder.query_tower, self.query_runtime,
                                               max_length=self.encoder.query_max_length)
        return self._onnx_queries

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        from twotower.encoders.towers import EncodeOptions

        if self.onnx_queries is not None:
            return self.onnx_queries.encode(self.encoder.query_texts(queries))
        return self.encoder.encode_queries(queries, EncodeOptions(precision=self.precision, show_progress=False))

    def run(
        self, queries: dict[str, str], k: int = 10, *, mode: str | None = None, lam: float | None = None,
        n_best: int = HYBRID_N_BEST, ef_search: int | None = None, nprobe: int | None = None,
        store: Store | None = None, norm: str | None = None, prf_depth: int | None = None,
        prf_weight: float | None = None, filter=None,
    ) -> dict[str, dict[str, float]]:
        """A run ``{query_id: {doc_id: score}}`` for ``queries`` (``{query_id: text}``), all from one
        index version (``store``, default the live one when the call starts): each query's ``k`` best
        (fewer only when fewer documents score). ``hybrid`` and ``rrf`` fuse each side's
        ``max(k, n_best)``-best. ``mode`` / ``lam`` / ``norm`` (the hybrid's normalisation) left out: the model's
        fitted choices (:meth:`resolve`; min-max when it has none). ``prf_depth``: the dense side searches again
        after Rocchio feedback from its ``prf_depth`` best, weighted by ``prf_weight`` (default
        ``prf.DEFAULT_WEIGHT``; ``retrieval.prf``; single-vector indexes). ``filter``: a metadata filter
        (:mod:`twotower.retrieval.filters`): every side searches only the documents it lets through, so each query
        gets the ``k`` best matching documents (PRF's feedback comes from matching documents too)."""
        mode, lam = self.resolve(mode, lam)
        if mode not in MODES:
            raise TwoTowerError(f"unknown search mode '{mode}': choose one of {', '.join(MODES)}")
        norm = norm or (self.defaults.norm if self.defaults is not None else None) or "minmax"
        if norm not in NORMS:
            raise TwoTowerError(f"unknown fusion normalisation '{norm}': choose one of {', '.join(NORMS)}")
        check_prf(prf_depth, prf_weight, mode=mode)
        store = store or self.store  # one version for the whole call
        only = restriction(store, filter)
        qids, texts = list(queries), list(queries.values())
        if "mask" in only and not only["mask"].any():  # nothing matches: no hits (and no encoding)
            return {q: {} for q in qids}
        depth = k if mode in ("dense", "bm25") else fusion_depth(k, n_best)
        runs = {}
        if mode != "bm25":
            q_vecs = self.encode_queries(texts)
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
        if only:  # feedback from the matching documents, as many as there are up to depth
            matches = int(only["mask"].sum()) if "mask" in only else store.count(only["expr"])
            if matches == 0:  # nothing to learn from (and nothing the search after finds)
                return q_vecs
            depth = min(depth, matches)
        _, rows = store.search(q_vecs, depth, ef_search=ef_search, nprobe=nprobe, **only)
        return rocchio(q_vecs, store.float_vectors(feedback_rows(rows, depth)), weight)

    def search(self, query: str, k: int = 10, **kwargs) -> list[Hit]:
        """The top ``k`` hits for one query, with titles."""
        store = self.store  # the same version for the ranking and the titles
        ranked = sorted(self.run({"q": query}, k, store=store, **kwargs)["q"].items(), key=lambda kv: -kv[1])[:k]
        return [Hit(d, s, store.document(store.row_of[d])["title"]) for d, s in ranked]
