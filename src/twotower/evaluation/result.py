"""What an evaluation measured (:class:`EvalResult`, what :func:`twotower.evaluate` and ``twotower eval`` return):
the metrics and per-query scores, the run, timings and what ran; written as the results JSON that ``twotower table``
reads and as a TREC run file.

Example::

    res = tt.evaluate("bm25", ds)
    print(res)  # EvalResult(scifact/test, bm25, 300 queries, ndcg@10=0.6863, ...)
    res.save("bm25.json")  # what ``twotower table bm25.json`` shows
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from twotower.retrieval.dense import Run


@dataclass
class EvalResult:
    """What :func:`twotower.evaluate` (``twotower eval``) measured: ``metrics`` (means over the judged queries),
    ``per_query`` (``{metric: {query_id: value}}``), the ``run`` (``{query_id: {doc_id: score}}``), ``timings``,
    what ran (``retriever``, ``model``, ``device``; a hybrid's λ and normalisation, the re-ranker, PRF) and
    ``warnings`` about the judgements or the index.

    Example::

        res = tt.evaluate("bm25", ds)
        print(res.metrics["ndcg@10"], min(res.per_query["ndcg@10"].values()))
        res.save("bm25.json", run_file="bm25.trec")
    """

    dataset: str
    split: str
    retriever: str
    model: str | None
    num_queries: int
    device: str | None
    metrics: dict[str, float]
    timings: dict[str, float]
    run: Run = field(repr=False, default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # not yet shown (the data set logs its own when loaded)
    hybrid_lambda: float | None = None  # the λ a hybrid run used
    fusion_norm: str | None = None  # and its normalisation
    rerank: str | None = None  # the re-ranker used, if any
    prf: dict | None = None  # {"depth", "weight"} of the dense side's pseudo-relevance feedback, if any
    per_query: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)  # {metric: {query_id: value}}
    runtime: dict | None = None  # what encoded: {"documents" | "queries": encoders.runtimes.last_choice}
    # the choices two evaluations of one model can differ in (tt.evaluate on an Index and twotower eval alike):
    mode: str | None = None  # the search mode run (an Index: the mode its searches take with no options)
    query_runtime: str | None = None  # what encoded the queries: torch | onnx | openvino | ... (None: BM25 alone)
    precision: str | None = None  # their precision (and the documents' when encoded now and different)
    passages: bool | None = None  # documents scored by their best passage (an index: as it was built)

    @property
    def choices(self) -> dict:
        """``{"mode", "query_runtime", "precision", "passages"}``: what this evaluation chose, so that two numbers
        for one model can be told apart (also in :meth:`to_json` and under ``twotower eval``'s table)."""
        return {"mode": self.mode, "query_runtime": self.query_runtime, "precision": self.precision,
                "passages": self.passages}

    def __repr__(self) -> str:  # one line: the data set, what ran, the main metrics
        shown = ", ".join(f"{k}={v:.4f}" for k, v in list(self.metrics.items())[:3])
        return (f"EvalResult({self.dataset}/{self.split}, {self.retriever}, {self.num_queries} queries"
                f"{', ' + shown if shown else ''})")

    def to_json(self) -> dict:
        return {
            "dataset": self.dataset,
            "split": self.split,
            "retriever": self.retriever,
            "model": self.model,
            "num_queries": self.num_queries,
            "device": self.device,
            "metrics": self.metrics,
            "timings": self.timings,
            **self.choices,
            **({"lambda": self.hybrid_lambda} if self.hybrid_lambda is not None else {}),
            **({"runtime": self.runtime} if self.runtime else {}),
            **({"fusion_norm": self.fusion_norm} if self.fusion_norm is not None else {}),
            **({"rerank": self.rerank} if self.rerank else {}),
            **({"prf": self.prf} if self.prf else {}),
        }

    def save(self, path: str | Path | None = None, *, run_file: str | Path | None = None,
             tag: str | None = None) -> None:
        """Write the results JSON (:meth:`to_json`, what ``twotower table`` reads) to ``path`` and/or the run as a
        TREC run file (``qid Q0 docid rank score tag``) to ``run_file``, each atomically (a directory, link or
        special file there is refused, before anything is written).

        Example::

            res.save("results.json", run_file="run.trec")
        """
        from twotower.evaluation.runs import write_run
        from twotower.io import atomic_write_json, check_output_files

        check_output_files(("path", path), ("run_file", run_file))
        if path is not None:
            atomic_write_json(path, self.to_json())
        if run_file is not None:
            write_run(self.run, run_file, tag=tag or f"twotower-{self.retriever}")
