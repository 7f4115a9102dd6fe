"""Evaluation: a retriever on a data set's judged queries, scored as BEIR scores (pytrec_eval)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from twotower.api._errors import user_errors
from twotower.errors import TwoTowerError

__all__ = ["evaluate", "read_result", "read_run", "score_run", "write_run"]

RETRIEVER_NAMES = ("bm25", "dense", "hybrid", "rrf", "multivector")


def _run_of(run):
    """A run as given, or an :class:`~twotower.EvalResult`'s ``run``."""
    from twotower.evaluation.result import EvalResult

    return run.run if isinstance(run, EvalResult) else run


def _dataset(dataset, split: str | None, strict: bool):
    from twotower.api.dataset import Dataset
    from twotower.data.beir import BeirDataset

    if isinstance(dataset, BeirDataset):
        if split is not None and split != dataset.split:
            if dataset.root is None:
                raise TwoTowerError(f"split '{split}': this in-memory data set holds split '{dataset.split}' only")
            return Dataset.load(dataset.root, split, strict=strict)
        return dataset
    if isinstance(dataset, (str, Path)):
        return None  # run_eval loads it, after checking every option
    raise TwoTowerError(f"dataset: give a Dataset (twotower.load_beir / Dataset.from_lists) or a BEIR folder path, "
                        f"not {type(dataset).__name__}")


@user_errors
def evaluate(
    retriever, dataset, *, split: str | None = None, metrics: Sequence[str] | None = None, k: int = 1000,
    mode: str | None = None, model: str | None = None, lam: float | None = None, norm: str | None = None,
    rerank: str | None = None, rerank_depth: int = 100, rerank_weight: float | None = None,
    prf_depth: int | None = None, prf_weight: float | None = None, multivector: int | None = None,
    language: str | None = None, k1: float | None = None, b: float | None = None, strict: bool = False,
    batch_size: int | None = None, precision: str = "auto", device: str = "auto",
    query_max_length: int | None = None, doc_max_length: int | None = None, pooling: str | None = None,
    compile: bool = False, show_progress: bool = False, runtime: str | None = None, passages: bool = True,
) -> EvalResult:
    """Retrieve the top ``k`` documents for every judged query of ``dataset`` and score them against its qrels
    (pytrec_eval with BEIR's conventions: graded relevance, a document with the query's own id left out).
    ``twotower eval`` is this function.

    ``retriever``: an :class:`~twotower.Index` (searched as stored, in the mode its searches take with no
    options: hybrid where it has BM25; ``mode`` picks another), an :class:`~twotower.Encoder` (loaded again
    from its name or directory with its pooling, lengths and precision) or a model name / directory (dense over
    the corpus, encoded now; ``mode`` picks ``hybrid``, ``rrf`` or ``multivector`` instead), or a retriever name (``bm25``; ``dense`` / ``hybrid`` / ``rrf`` / ``multivector`` with ``model``).
    A model fitted by :func:`twotower.fit` brings its own mode, λ and re-ranker unless given. ``dataset``: a
    :class:`~twotower.Dataset` or a BEIR folder (``split``, default ``test``). ``metrics``: e.g. ``("ndcg@10",
    "recall@100", "map@1000", "mrr@10", "p@1", "acc@5")``; by default nDCG@10, Recall@100, MRR@10, P@1, Recall@1000.
    ``runtime``: what encodes on a CPU, ``auto`` | ``torch`` | ``onnx`` | ``openvino`` | ``onnx-int8`` |
    ``openvino-int8`` (None: an Encoder's own, else auto); what ran is in the result's ``runtime``.
    ``passages``: a corpus encoded now splits documents longer than the model's window into passages and scores each
    document by its best one, as an index does (``False``: each document's first window; an
    :class:`~twotower.Index` is searched as it was built).

    Example::

        import twotower as tt

        ds = tt.load_beir("my-beir-dir")
        bm25 = tt.evaluate("bm25", ds, metrics=["ndcg@10", "recall@100"])
        dense = tt.evaluate(tt.Encoder.load(), ds, metrics=["ndcg@10", "recall@100"])
        print(bm25.metrics, dense.metrics)
    """
    from twotower.api.encoder import Encoder
    from twotower.api.index import Index
    from twotower.evaluation.metrics import DEFAULT_METRICS
    from twotower.evaluation.pipeline import EvalConfig, run_eval

    from twotower.api.encoder import model_argument

    model = model_argument(model, "model")
    if not isinstance(retriever, (str, Path, Index, Encoder)) and isinstance(retriever, os.PathLike):
        retriever = Path(os.fspath(retriever))  # a FitResult: its model
    index = None
    if retriever is None:  # decided by the model: a fitted model's own mode, else dense; no model: BM25
        retriever_name = mode
    elif isinstance(retriever, Index):
        index = retriever.path
        model = model or retriever._searcher._model_override
        # the Index's own settings where none are given here: it is evaluated as it was opened
        precision = retriever.precision if precision == "auto" else precision
        device = retriever.device if device == "auto" else device
        # the mode twotower fit chose for the index's model (read by run_eval), else the mode its searches take
        # with no options (hybrid where it has BM25): the number a user's own searches would score
        retriever_name = mode or (None if retriever._searcher.defaults is not None else retriever.resolve()[0])
    elif isinstance(retriever, Encoder):
        if model is not None:
            raise TwoTowerError("model: the Encoder given as the retriever is the model; drop model=")
        model, retriever_name = retriever.source or "all-MiniLM-L6-v2", mode or "dense"
        # loaded again from its source, with the settings it was loaded with
        dual = retriever.model
        pooling = pooling or dual.doc_tower.pooling
        query_max_length = query_max_length or dual.query_max_length
        doc_max_length = doc_max_length or dual.doc_max_length
        batch_size = batch_size or retriever.batch_size
        precision = retriever.precision if precision == "auto" else precision
        runtime = runtime or retriever.runtime
    elif isinstance(retriever, (str, Path)) and str(retriever) in RETRIEVER_NAMES:
        if mode is not None and mode != str(retriever):
            raise TwoTowerError(f"retriever '{retriever}' and mode '{mode}' disagree: give one")
        retriever_name = str(retriever)
    elif isinstance(retriever, (str, Path)):  # a model name or directory
        if model is not None:
            raise TwoTowerError(f"model: the retriever '{retriever}' is a model already; drop model=")
        model, retriever_name = str(retriever), mode
    else:
        raise TwoTowerError(f"retriever: give an Index, an Encoder, a model name or one of "
                            f"{', '.join(RETRIEVER_NAMES)}, not {type(retriever).__name__}")
    ds = _dataset(dataset, split, strict)
    metric_names = tuple(metrics) if metrics is not None else DEFAULT_METRICS
    if isinstance(metrics, str):
        metric_names = tuple(m.strip() for m in metrics.split(",") if m.strip())
    if ds is None:
        data, split = Path(dataset), split or "test"
    else:
        data, split = (Path(ds.root) if ds.root is not None else Path(".")), ds.split
    cfg = EvalConfig(
        data=data, split=split, retriever=retriever_name,
        model=model, top_k=k, batch_size=batch_size, precision=precision, device=device,
        query_max_length=query_max_length, doc_max_length=doc_max_length, pooling=pooling, k1=k1, b=b, strict=strict,
        metrics=metric_names, show_progress=show_progress, index=index, rerank=rerank, rerank_depth=rerank_depth,
        hybrid_lambda=lam, multivector=multivector, compile=compile, language=language, fusion_norm=norm,
        rerank_weight=rerank_weight, prf_depth=prf_depth, prf_weight=prf_weight, passages=bool(passages),
    )
    from twotower.encoders.runtimes import using_runtime

    with using_runtime(runtime or "auto") as used:
        result = run_eval(cfg, dataset=ds)
    result.runtime = used or None
    result.query_runtime, result.precision = _encoded(used or {})
    return result


def _encoded(used: dict) -> tuple[str | None, str | None]:
    """(query runtime, precision) from what encoded during an evaluation (``using_runtime``'s record): the queries'
    runtime and precision, the documents' precision named too where it differs (None, None: nothing encoded)."""
    queries, docs = used.get("queries") or {}, used.get("documents") or {}
    precision = queries.get("precision") or docs.get("precision")
    if docs.get("precision") and queries.get("precision") and docs["precision"] != queries["precision"]:
        precision = f"documents {docs['precision']}, queries {queries['precision']}"
    return queries.get("runtime"), precision


@user_errors
def score_run(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]],
              metrics: Sequence[str] | None = None, *, per_query: bool = False) -> dict:
    """Score any run ``{query_id: {doc_id: score}}`` (yours, or one read with :func:`read_run`) against qrels, with
    the conventions :func:`evaluate` uses. ``per_query=True``: ``{metric: {query_id: value}}`` instead of means.
    ``run`` may be an :class:`~twotower.EvalResult` (its run), ``qrels`` a :class:`~twotower.Dataset` (its qrels).

    Example::

        qrels = {"q1": {"d1": 1}}
        print(tt.score_run({"q1": {"d1": 2.0, "d2": 1.0}}, qrels, ["ndcg@10", "p@1"]))  # {'ndcg@10': 1.0, 'p@1': 1.0}
    """
    from twotower.evaluation.metrics import DEFAULT_METRICS, check_metrics, check_qrels, check_run, evaluate as _mean
    from twotower.evaluation.metrics import per_query as _per_query

    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    names = tuple(metrics) if metrics is not None else DEFAULT_METRICS
    check_metrics(names)
    from twotower.data.beir import BeirDataset

    run = _run_of(run)
    qrels = qrels.qrels if isinstance(qrels, BeirDataset) else qrels
    check_run(run)
    check_qrels(qrels)
    qrels = {q: {d: int(g) for d, g in rels.items()} for q, rels in qrels.items()}  # numpy ints: plain ints
    run = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()}
    return _per_query(qrels, run, names) if per_query else _mean(qrels, run, names)


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """Read a TREC run file (``qid Q0 docid rank score tag``) as ``{query_id: {doc_id: score}}``.

    Example::

        run = tt.read_run("bm25.trec")
    """
    from twotower.evaluation.result import EvalResult
    from twotower.evaluation.runs import read_run as _read

    if isinstance(path, EvalResult):  # read already: its run
        return {q: dict(docs) for q, docs in path.run.items()}
    if not isinstance(path, (str, os.PathLike)):
        raise TwoTowerError(f"path: a TREC run file (a str or pathlib.Path) or an EvalResult, not "
                            f"{type(path).__name__}")
    return _read(path)


@user_errors
def write_run(run: dict[str, dict[str, float]], path: str | Path, *, tag: str = "twotower") -> None:
    """Write ``{query_id: {doc_id: score}}`` (or an :class:`~twotower.EvalResult`'s run) as a TREC run file, best
    first per query, atomically.

    Example::

        tt.write_run({"q1": {"d1": 2.0, "d2": 1.0}}, "my.trec", tag="mine")
    """
    from twotower.evaluation.metrics import check_run
    from twotower.evaluation.runs import write_run as _write
    from twotower.io import check_output_file

    run = _run_of(run)
    check_run(run)  # a NaN score or an int id would be written as a line no reader takes
    check_output_file(path, "path")
    _write(run, path, tag=tag)


def read_result(path: str | Path) -> dict:
    """Read a results JSON written by :meth:`EvalResult.save` or ``twotower eval --out``, checked: a regular file of
    at most 16 MiB holding ``retriever``, ``metrics`` and ``timings`` as numbers (what ``twotower table`` shows).
    An :class:`~twotower.EvalResult` gives the same row (:meth:`~twotower.EvalResult.to_json`).

    Example::

        row = tt.read_result("bm25.json")
        print(row["retriever"], row["metrics"]["ndcg@10"])
    """
    import json
    import math

    from twotower.evaluation.result import EvalResult
    from twotower.io import MiB, read_input_text

    if isinstance(path, EvalResult):  # in memory already: the row its save() would write
        return {**path.to_json(), "timings": dict(path.timings)}
    if not isinstance(path, (str, os.PathLike)):
        raise TwoTowerError(f"path: a results JSON file (a str or pathlib.Path) or an EvalResult, not "
                            f"{type(path).__name__}")
    try:
        row = json.loads(read_input_text(path, what="results JSON", limit=16 * MiB))
    except json.JSONDecodeError as exc:
        raise TwoTowerError(f"{path}: cannot read results JSON ({exc})") from None
    metrics = row.get("metrics") if isinstance(row, dict) else None
    if (not isinstance(metrics, dict) or not isinstance(row.get("retriever"), str)
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values())
            or not isinstance(row.get("timings", {}), dict)):
        raise TwoTowerError(f"{path}: not a result of 'twotower eval --out' (it needs 'retriever' and a 'metrics' "
                            "object of numbers)")
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise TwoTowerError(f"{path}: metric '{bad[0]}' is {metrics[bad[0]]}, not a finite number: not a result "
                            "'twotower eval --out' writes")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row.get("timings", {}).values()):
        raise TwoTowerError(f"{path}: 'timings' must map names to numbers (seconds, queries/s), as "
                            "'twotower eval --out' writes them")
    return {**row, "timings": row.get("timings", {})}
