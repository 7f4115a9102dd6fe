"""End-to-end evaluation of a retriever on a BEIR split: index, search, score, time (what it returns:
:class:`~twotower.evaluation.result.EvalResult`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from twotower.data.beir import BeirDataset
from twotower.checks import flag, given
from twotower.encoders.device import describe, resolve_device
from twotower.errors import TwoTowerError
from twotower.evaluation.judgements import check_judgements
from twotower.evaluation.metrics import DEFAULT_METRICS, check_metrics, mean_metrics, per_query
from twotower.evaluation.result import EvalResult
from twotower.retrieval.dense import Run, to_run
from twotower.retrieval.index.eval_check import check_index_for_eval

log = logging.getLogger(__name__)


def _mode(value: str | None = None) -> str:
    """tt.evaluate's ``mode`` (``--retriever`` on the command line), with ``value`` when given."""
    return flag("mode", "--retriever") if value is None else given("mode", value, "--retriever")


_LAMBDA, _NORM, _INDEX = ("lam", "--lambda"), ("norm", "--fusion-norm"), ("retriever", "--index")  # Python, CLI

RETRIEVERS = ("bm25", "dense", "hybrid", "rrf", "multivector")
NO_RERANK = "none"  # --rerank none: leave out the re-ranker a fitted model carries
DEFAULT_MULTIVECTOR = 8  # ME-BERT m for models not trained with --multivector


@dataclass
class EvalConfig:
    data: Path
    split: str = "test"
    retriever: str | None = None  # None: dense when a model is given, else bm25 (see resolve_retriever)
    model: str | None = None
    top_k: int = 1000
    batch_size: int | None = None  # None: the device's default (32 on CPU, 128 on CUDA)
    precision: str = "auto"
    device: str = "auto"  # where models run: auto (the GPU where there is one) | cpu | cuda | cuda:N
    query_max_length: int | None = None
    doc_max_length: int | None = None
    pooling: str | None = None
    k1: float | None = None
    b: float | None = None
    strict: bool = False
    metrics: tuple[str, ...] = DEFAULT_METRICS
    show_progress: bool = True
    index: Path | None = None  # a stored index (twotower index build) to search instead of encoding the corpus
    rerank: str | None = None  # cross-encoder directory: re-rank each query's top ``rerank_depth``
    rerank_depth: int = 100
    hybrid_lambda: float | None = None  # default: twotower.retrieval.searcher.DEFAULT_LAMBDA
    multivector: int | None = None  # ME-BERT m when no --index is given (default: the model's trained m, else 8)
    compile: bool = False  # torch.compile the dense retriever's document encoding
    language: str | None = None  # BM25's text analysis (retrieval.analyzers; None: en, or the --index's own)
    fusion_norm: str | None = None  # the hybrid's per-query normalisation (retrieval.hybrid.NORMS; None: minmax)
    rerank_weight: float | None = None  # the re-ranker's share in retrieval.rerank.blend (None: it ranks alone)
    prf_depth: int | None = None  # dense pseudo-relevance feedback (retrieval.prf): documents fed back; None: off
    prf_weight: float | None = None  # and their share (None: 1, as much as the query)
    passages: bool = True  # dense without --index: long documents as passages, scored by their best (MaxP)


def apply_model_defaults(cfg: "EvalConfig", model_dir: str | None = None) -> "EvalConfig":
    """``cfg`` with the retrieval choices that ``twotower fit`` stored in the model (``retrieval.defaults``) filled
    in where the user left them out: the mode when no --retriever is given, its λ when no --lambda is given, its
    re-ranker when neither --retriever nor --rerank is given (``--rerank none`` leaves it out), its BM25 language
    when no --language is given (and no --index, whose BM25 has its own).
    ``model_dir``: where to read them (default ``cfg.model``; an index's model for ``--index``)."""
    from twotower.retrieval.defaults import read_defaults

    defaults = read_defaults(model_dir or cfg.model)
    if defaults is None:
        return replace(cfg, rerank=None) if cfg.rerank == NO_RERANK else cfg
    retriever, lam, rerank, depth = cfg.retriever, cfg.hybrid_lambda, cfg.rerank, cfg.rerank_depth
    weight = cfg.rerank_weight
    if retriever is None:
        retriever = defaults.mode
        if rerank is None and defaults.rerank:
            rerank, depth = defaults.rerank_path(model_dir or cfg.model), defaults.rerank_depth
            weight = cfg.rerank_weight if cfg.rerank_weight is not None else defaults.rerank_weight
    if lam is None and retriever == "hybrid" and defaults.lam is not None:
        lam = defaults.lam
    norm = cfg.fusion_norm
    if norm is None and retriever == "hybrid" and defaults.norm is not None:
        norm = defaults.norm
    if rerank == NO_RERANK:
        rerank = None
    language = cfg.language
    if language is None and cfg.index is None and defaults.language:  # an index's BM25 has its own
        language = defaults.language
    log.info("retrieval from the model's fitted choices: %s%s%s%s", retriever,
             f", λ {lam}" + (f" ({norm})" if norm else "") if retriever == "hybrid" and lam is not None else "", f", re-ranked by {rerank}" if rerank else "",
             f", BM25 language {language}" if language else "")
    # fit chose BM25 alone (no labels, an encoder without the data's language): the model is not used
    model = None if retriever == "bm25" and cfg.retriever is None else cfg.model
    return replace(cfg, retriever=retriever, hybrid_lambda=lam, rerank=rerank, rerank_depth=depth, language=language,
                   model=model, fusion_norm=norm, rerank_weight=weight)


def resolve_retriever(retriever: str | None, model: str | None) -> str:
    """The retriever to run: ``retriever`` when given, else dense when a ``model`` is named, else bm25
    (a model fitted by ``twotower fit`` names its own: :func:`apply_model_defaults` runs first).

    A model with ``bm25`` is refused: BM25 uses no model, and running it anyway would report BM25's
    numbers under a model the user meant to evaluate."""
    if retriever is None:
        return "dense" if model else "bm25"
    if retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever '{retriever}': choose one of {', '.join(RETRIEVERS)}")
    if retriever == "bm25" and model:
        raise TwoTowerError(
            f"{given('model', model)} is not used by {_mode('bm25')} (BM25 has no model): leave out {_mode()} (a "
            f"{flag('model')} alone means dense) or pass {_mode()} dense | hybrid | rrf | multivector, or drop "
            f"{flag('model')}"
        )
    return retriever


def _bm25_run(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    from twotower.retrieval.bm25 import BM25, BM25Params

    defaults = BM25Params()
    params = BM25Params(k1=cfg.k1 if cfg.k1 is not None else defaults.k1, b=cfg.b if cfg.b is not None else defaults.b,
                        language=cfg.language or "en")
    doc_ids = list(ds.corpus)
    t0 = time.perf_counter()
    bm25 = BM25(params).index(doc_ids, [ds.corpus[d].full_text for d in doc_ids], show_progress=cfg.show_progress)
    timings["index_s"] = time.perf_counter() - t0
    qids = list(ds.queries)
    t0 = time.perf_counter()
    run = bm25.search_run(qids, [ds.queries[q] for q in qids], cfg.top_k, show_progress=cfg.show_progress)
    timings["queries_per_s"] = len(qids) / (time.perf_counter() - t0)
    return run  # documents matching no query term left out


def _dense_run(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.retrieval.dense import exact_search

    model = DualEncoder.load(
        cfg.model, pooling=cfg.pooling, query_max_length=cfg.query_max_length, doc_max_length=cfg.doc_max_length,
        device=resolve_device(cfg.device),
    )
    opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress)
    doc_ids = list(ds.corpus)
    t0 = time.perf_counter()
    # passages as an index with passages searches (PRF: each document's first window)
    offsets, texts = _passages(model, ds, doc_ids) if cfg.passages and not cfg.prf_depth else \
        (None, [ds.corpus[d].full_text for d in doc_ids])
    doc_vecs = model.encode_documents(texts, replace(opts, compile=cfg.compile))
    elapsed = time.perf_counter() - t0
    timings["index_s"] = elapsed
    timings["encode_docs_per_s"] = len(doc_ids) / elapsed
    qids = list(ds.queries)
    t0 = time.perf_counter()
    q_vecs = model.encode_queries([ds.queries[q] for q in qids], opts)
    if offsets is not None:  # each document scored by its best passage, exactly
        from twotower.retrieval.multivector import exact_multivector_search

        scores, idx = exact_multivector_search(q_vecs, doc_vecs, offsets, cfg.top_k)
    elif cfg.prf_depth:
        from twotower.retrieval.prf import search_with_feedback

        scores, idx = search_with_feedback(q_vecs, doc_vecs, cfg.top_k, cfg.prf_depth, _prf_weight(cfg))
    else:
        scores, idx = exact_search(q_vecs, doc_vecs, cfg.top_k)
    timings["queries_per_s"] = len(qids) / (time.perf_counter() - t0)
    return to_run(qids, doc_ids, scores, idx)


def _passages(model, ds: BeirDataset, doc_ids: list[str]):
    """``(offsets, texts)``: the corpus split into passages as an index splits it by default
    (:mod:`twotower.encoders.passages`)."""
    from twotower.encoders.passages import default_split

    split = default_split(model, [ds.corpus[d] for d in doc_ids], doc_ids)
    return split.offsets, split.texts


def _prf_weight(cfg: EvalConfig) -> float:
    from twotower.retrieval.prf import DEFAULT_WEIGHT

    return DEFAULT_WEIGHT if cfg.prf_weight is None else cfg.prf_weight


def _hybrid_run(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    from twotower.retrieval.hybrid import fusion_depth, interpolate, rrf
    from twotower.retrieval.searcher import DEFAULT_LAMBDA, HYBRID_N_BEST

    dense_t: dict[str, float] = {}
    sparse_t: dict[str, float] = {}
    n_best = fusion_depth(cfg.top_k, HYBRID_N_BEST)  # each side deep enough for top_k fused documents
    deep = replace(cfg, top_k=n_best)
    dense, sparse = _dense_run(deep, ds, dense_t), _bm25_run(deep, ds, sparse_t)
    timings["index_s"] = dense_t["index_s"] + sparse_t["index_s"]
    n_q = len(ds.queries)
    timings["queries_per_s"] = n_q / (n_q / dense_t["queries_per_s"] + n_q / sparse_t["queries_per_s"])
    if cfg.retriever == "rrf":
        return rrf([dense, sparse], n_best=n_best, top_k=cfg.top_k)
    lam = DEFAULT_LAMBDA if cfg.hybrid_lambda is None else cfg.hybrid_lambda
    return interpolate(dense, sparse, lam, n_best=n_best, top_k=cfg.top_k, norm=cfg.fusion_norm or "minmax")


def _multivector_run(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    from twotower.encoders.towers import DualEncoder, EncodeOptions
    from twotower.retrieval.multivector import encode_multivector, exact_multivector_search

    model = DualEncoder.load(
        cfg.model, pooling=cfg.pooling, query_max_length=cfg.query_max_length, doc_max_length=cfg.doc_max_length,
        device=resolve_device(cfg.device),
    )
    m = cfg.multivector or model.multivector or DEFAULT_MULTIVECTOR
    log.info("multi-vector documents: first %d token vectors", m)
    doc_ids = list(ds.corpus)
    t0 = time.perf_counter()
    vecs, offsets = encode_multivector(
        model.doc_tower, [ds.corpus[d].full_text for d in doc_ids], m, max_length=model.doc_max_length,
        batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress,
    )
    timings["index_s"] = time.perf_counter() - t0
    qids = list(ds.queries)
    t0 = time.perf_counter()
    opts = EncodeOptions(batch_size=cfg.batch_size, precision=cfg.precision, show_progress=cfg.show_progress)
    q_vecs = model.encode_queries([ds.queries[q] for q in qids], opts)
    scores, idx = exact_multivector_search(q_vecs, vecs, offsets, cfg.top_k)
    timings["queries_per_s"] = len(qids) / (time.perf_counter() - t0)
    return to_run(qids, doc_ids, scores, idx)


def _index_run(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    """Search a stored index (its own encoder, FAISS kind and BM25) for the split's queries."""
    from twotower.errors import TwoTowerError
    from twotower.retrieval.bm25 import BM25Params
    from twotower.retrieval.searcher import DEFAULT_LAMBDA, Searcher

    searcher = Searcher(cfg.index, model=cfg.model, precision=cfg.precision, device=cfg.device)
    bm25_saved = searcher.store.manifest.get("bm25")
    if cfg.language not in (None, "auto") and (cfg.retriever not in ("bm25", "hybrid", "rrf") or not bm25_saved):
        raise TwoTowerError(f"{given('language', cfg.language)} sets BM25's text analysis; "
                            + (f"{_mode(cfg.retriever)} does not use BM25" if bm25_saved else
                               f"{cfg.index} has no BM25") + f": drop {flag('language')}")
    if cfg.language not in (None, "auto") and cfg.retriever in ("bm25", "hybrid", "rrf") and bm25_saved:
        saved = BM25Params.from_dict(bm25_saved).language
        if cfg.language != saved:
            raise TwoTowerError(f"{cfg.index}: its BM25 was built for language '{saved}', not '{cfg.language}': "
                                f"drop {flag('language')} (the index's own is used) or rebuild with "
                                f"{given('language', cfg.language)}")
    if cfg.retriever == "multivector" and not searcher.store.multivector:
        raise ValueError(f"{cfg.index}: not a multi-vector index (build it with {flag('multivector')} M)")
    mode = "dense" if cfg.retriever == "multivector" else cfg.retriever
    timings["index_s"] = 0.0
    t0 = time.perf_counter()
    run = searcher.run(dict(ds.queries), cfg.top_k, mode=mode, norm=cfg.fusion_norm,
                       lam=DEFAULT_LAMBDA if cfg.hybrid_lambda is None else cfg.hybrid_lambda,
                       prf_depth=cfg.prf_depth, prf_weight=cfg.prf_weight)
    timings["queries_per_s"] = len(ds.queries) / (time.perf_counter() - t0)
    return run


def _retrieve(cfg: EvalConfig, ds: BeirDataset, timings: dict) -> Run:
    if cfg.index is not None:
        run = _index_run(cfg, ds, timings)
    else:
        run = {"bm25": _bm25_run, "dense": _dense_run, "hybrid": _hybrid_run, "rrf": _hybrid_run,
               "multivector": _multivector_run}[
            cfg.retriever
        ](cfg, ds, timings)
    if cfg.rerank:
        from twotower.retrieval.rerank import Reranker

        t0 = time.perf_counter()
        reranker = Reranker(cfg.rerank, batch_size=cfg.batch_size or 32, precision=cfg.precision,
                            device=str(resolve_device(cfg.device)))
        run = reranker.rerank(run, ds.queries, lambda d: ds.corpus[d].full_text, top_n=cfg.rerank_depth,
                              show_progress=cfg.show_progress, weight=cfg.rerank_weight)
        timings["rerank_s"] = time.perf_counter() - t0
        # queries/s is the whole pipeline's: the first stage's time per query plus the re-ranking's
        first = timings.get("queries_per_s")
        n_q = len(ds.queries)
        if first and n_q:
            timings["first_stage_queries_per_s"] = first
            timings["queries_per_s"] = n_q / (n_q / first + timings["rerank_s"])
    return run


def _index_manifest(index: Path | None) -> dict:
    """A stored index's manifest, read once for an evaluation: the model directory it was built with (for its
    fitted retrieval choices) and whether it keeps passages; ``{}`` without an index."""
    if index is None:
        return {}
    from twotower.retrieval.backends import open_store

    try:
        return open_store(index).manifest
    except (TwoTowerError, OSError, ValueError):
        return {}  # check_index_for_eval reports what is wrong with the index


def _passages_used(cfg: EvalConfig, manifest: dict) -> bool | None:
    """Whether documents were scored by their best passage: an index as it was built (its ``manifest``'s
    ``passages``), a corpus encoded now by ``cfg.passages`` (dense, hybrid, rrf without PRF); None: BM25 alone."""
    if cfg.index is not None:
        return bool(manifest.get("passages")) if manifest else None
    if cfg.retriever == "bm25":
        return None
    return bool(cfg.passages and not cfg.prf_depth and cfg.retriever != "multivector")


def check_eval_options(cfg: EvalConfig) -> None:
    """Refuse, before any loading, numbers out of range and options the chosen retriever would silently ignore."""
    from twotower.retrieval.bm25 import BM25Params

    check_metrics(cfg.metrics)
    from twotower.checks import check_number

    check_number(cfg.top_k, "k", integer=True, minimum=1, option="--top-k")
    for name in ("batch_size", "query_max_length", "doc_max_length", "multivector", "prf_depth"):
        check_number(getattr(cfg, name), name, integer=True, minimum=1, optional=True)
    check_number(cfg.rerank_depth, "rerank_depth", integer=True, minimum=1)
    check_number(cfg.hybrid_lambda, "lam", minimum=0, maximum=1, optional=True, option="--lambda")
    check_number(cfg.rerank_weight, "rerank_weight", minimum=0, maximum=1, optional=True)
    check_number(cfg.prf_weight, "prf_weight", above=0, optional=True)
    for name in ("k1", "b"):
        check_number(getattr(cfg, name), name, minimum=0, optional=True)
    BM25Params(k1=1.5 if cfg.k1 is None else cfg.k1, b=0.75 if cfg.b is None else cfg.b)
    if cfg.hybrid_lambda is not None and cfg.retriever != "hybrid":
        raise TwoTowerError(f"{flag(*_LAMBDA)} weighs dense against BM25 in {_mode('hybrid')}; "
                            f"{_mode(cfg.retriever)} does not use it: drop {flag(*_LAMBDA)} or pass {_mode('hybrid')}")
    if cfg.rerank_weight is not None:
        if not 0 <= cfg.rerank_weight <= 1:
            raise TwoTowerError(f"{given('rerank_weight', cfg.rerank_weight)}: the re-ranker's share, from 0 to 1")
        if not cfg.rerank:
            raise TwoTowerError(f"{flag('rerank_weight')} blends a re-ranker's scores with the first stage's: pass "
                                f"{flag('rerank')} DIR (or a model fitted with one) or drop it")
    if cfg.fusion_norm is not None:
        from twotower.retrieval.hybrid import NORMS

        if cfg.fusion_norm not in NORMS:
            raise TwoTowerError(f"{given(_NORM[0], cfg.fusion_norm, _NORM[1])}: choose one of {', '.join(NORMS)}")
        if cfg.retriever != "hybrid":
            raise TwoTowerError(f"{flag(*_NORM)} normalises the two sides of {_mode('hybrid')}; "
                                f"{_mode(cfg.retriever)} does not use it: drop it or pass {_mode('hybrid')}")
    from twotower.retrieval.prf import check_prf

    check_prf(cfg.prf_depth, cfg.prf_weight, mode=cfg.retriever, mode_option="--retriever")
    if cfg.index is not None:  # the index's encoder encoded its documents and encodes the queries as it was built
        unused = [flag(name) for name, value in (("query_max_length", cfg.query_max_length),
                                                 ("doc_max_length", cfg.doc_max_length), ("pooling", cfg.pooling),
                                                 ("batch_size", cfg.batch_size)) if value is not None]
        unused += [flag("compile")] if cfg.compile else []
        if unused:
            raise TwoTowerError(f"{', '.join(unused)}: a stored index ({flag(*_INDEX)}) encodes with the settings "
                                f"its encoder was built with, so these would be ignored; drop them, or evaluate "
                                f"without {flag(*_INDEX)}")
    set_bm25 = [flag(name) for name, value in (("k1", cfg.k1), ("b", cfg.b)) if value is not None]
    if set_bm25 and cfg.index is not None:
        raise TwoTowerError(f"{'/'.join(set_bm25)}: a stored index ({flag(*_INDEX)}) scores with the BM25 parameters "
                            f"it was built with; drop them, or evaluate without {flag(*_INDEX)}")
    if set_bm25 and cfg.retriever not in ("bm25", "hybrid"):
        raise TwoTowerError(f"{'/'.join(set_bm25)} set BM25, which {_mode(cfg.retriever)} does not use: drop them "
                            f"or pass {_mode()} bm25 | hybrid")
    if cfg.multivector is not None and (cfg.retriever != "multivector" or cfg.index is not None):
        raise TwoTowerError(f"{flag('multivector')} sets ME-BERT's m for {_mode('multivector')} without "
                            f"{flag(*_INDEX)} (an index keeps its own m): drop {flag('multivector')} or pass "
                            f"{_mode('multivector')}")


def run_eval(cfg: EvalConfig, dataset: BeirDataset | None = None) -> EvalResult:
    """Evaluate ``cfg``'s retriever on its data (``dataset``, when given, instead of loading ``cfg.data``)."""
    from twotower.retrieval.searcher import DEFAULT_LAMBDA

    manifest = _index_manifest(cfg.index)
    cfg = apply_model_defaults(cfg, cfg.model or manifest.get("model", {}).get("path"))
    cfg = replace(cfg, retriever=resolve_retriever(cfg.retriever, cfg.model))
    check_eval_options(cfg)
    device = resolve_device(cfg.device)  # a bad --device stops here, before any work
    uses_model = cfg.retriever != "bm25" or cfg.index is not None or cfg.rerank is not None
    from twotower.retrieval.analyzers import check_language

    if cfg.language is not None:
        check_language(cfg.language)
    ds = dataset if dataset is not None else BeirDataset.load(cfg.data, cfg.split, strict=cfg.strict)
    name = Path(ds.root).name if ds.root is not None else "in-memory"
    if cfg.prf_depth and cfg.prf_depth > len(ds.corpus):  # before any encoding
        raise TwoTowerError(f"{given('prf_depth', cfg.prf_depth)}: {ds.root or name} has only {len(ds.corpus)} "
                            f"documents to feed back; lower {flag('prf_depth')}")
    qrels_source = Path(ds.root) / "qrels" / f"{ds.split}.tsv" if ds.root is not None else f"qrels of '{ds.split}'"
    judged = check_judgements(ds.qrels, qrels_source)  # nothing relevant, absurd grades: before any encoding
    index_check = check_index_for_eval(cfg.index, ds, retriever=cfg.retriever, model=cfg.model)  # same corpus?
    timings: dict[str, float] = {}
    run = _retrieve(cfg, ds, timings)
    scores = per_query(ds.qrels, run, cfg.metrics)
    metrics = mean_metrics(scores)
    model_name = None
    if cfg.retriever != "bm25":
        model_name = index_check.model or cfg.model or "all-MiniLM-L6-v2"
    return EvalResult(
        dataset=name,
        split=ds.split,
        retriever=cfg.retriever,
        model=model_name,
        num_queries=len(ds.queries),
        device=describe(device) if uses_model else None,
        metrics=metrics,
        timings={k: round(v, 4) for k, v in timings.items()},
        run=run,
        hybrid_lambda=(DEFAULT_LAMBDA if cfg.hybrid_lambda is None else cfg.hybrid_lambda)
        if cfg.retriever == "hybrid" else None,
        fusion_norm=(cfg.fusion_norm or "minmax") if cfg.retriever == "hybrid" else None,
        rerank=cfg.rerank,
        prf={"depth": cfg.prf_depth, "weight": _prf_weight(cfg)} if cfg.prf_depth else None,
        warnings=[*judged, *index_check.warnings],  # the data set's own warnings were logged once by its loader
        per_query=scores,
        mode=cfg.retriever,
        passages=_passages_used(cfg, manifest),
    )
