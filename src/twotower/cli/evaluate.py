"""``twotower eval`` (a retriever's metrics on a BEIR split) and ``twotower table`` (saved results side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

import twotower as tt
from twotower.cli.console import (BATCH_HELP, COMPILE_HELP, DEVICE_HELP, LANGUAGE_HELP, PRF_DEPTH_HELP,
                                  PRF_WEIGHT_HELP, RUNTIME_HELP, console, fail, warn)
from twotower.cli.helpers import check_outputs
from twotower.cli.options import Progress
from twotower.errors import TwoTowerError


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
    app.command("table")(table_cmd)


def metrics_table(rows: list[dict], title: str = "") -> Table:
    """A rich table: one row per result JSON (``retriever``, ``model``, ``metrics``, ``timings``)."""
    metric_names = list(dict.fromkeys(m for r in rows for m in r["metrics"]))
    table = Table(title=title or None)
    for name in ("retriever", "model", *metric_names, "queries/s"):
        table.add_column(name, justify="left" if name in ("retriever", "model") else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            r["retriever"] + (" + rerank" if r.get("rerank") else ""),  # queries/s then includes the re-ranking
            str(r.get("model") or "-"),
            *[f"{r['metrics'][m]:.4f}" if m in r["metrics"] else "-" for m in metric_names],
            f"{r['timings'].get('queries_per_s', float('nan')):.1f}",
        )
    return table


def choices_line(row: dict) -> str:
    """What an evaluation chose (``mode``, ``query_runtime``, ``precision``, ``passages``: the choices two numbers
    for one model can differ in), as one line under ``twotower eval``'s table."""
    passages = {True: "on", False: "off"}.get(row.get("passages"), "-")
    encoded = " ".join(str(row[k]) for k in ("query_runtime", "precision") if row.get(k)) or "-"
    return (f"mode {row.get('mode') or row['retriever']}; query_runtime/precision {encoded}; "
            f"passages {passages}")


def eval_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR-format directory (corpus.jsonl, queries.jsonl, qrels/)."),
    split: str = typer.Option("test", help="qrels split to evaluate."),
    retriever: Optional[str] = typer.Option(
        None, help="bm25 | dense | hybrid | rrf | multivector (default: the mode 'twotower fit' chose for --model, "
        "else dense when --model is given, else bm25)"),
    model: Optional[str] = typer.Option(None, help="Model directory or registered name for dense retrieval "
                                                   "(default: all-MiniLM-L6-v2); refused with --retriever bm25."),
    top_k: int = typer.Option(1000, "--top-k", min=1, help="Documents retrieved per query."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    precision: str = typer.Option("auto", help="auto (bf16 where the CPU/GPU has fast bf16) | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    query_max_length: Optional[int] = typer.Option(None, "--query-max-length", min=1),
    doc_max_length: Optional[int] = typer.Option(None, "--doc-max-length", min=1),
    pooling: Optional[str] = typer.Option(None, help="mean | cls | max (default: the model's own config, else mean)"),
    k1: Optional[float] = typer.Option(None, help="BM25 k1 (default 1.5)."),
    b: Optional[float] = typer.Option(None, help="BM25 b (default 0.75)."),
    language: Optional[str] = typer.Option(None, "--language", help=LANGUAGE_HELP + " Default en; with --index, its own."),
    strict: bool = typer.Option(False, help="Fail on qrels that name unknown queries or documents."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write results JSON here."),
    run_file: Optional[Path] = typer.Option(None, "--run", help="Write a TREC run file here."),
    metrics: str = typer.Option(
        "ndcg@10,recall@100,mrr@10,p@1,recall@1000",
        help="Comma-separated metrics: ndcg|recall|p|map|mrr|acc @k (acc@k = top-k answer accuracy: "
        "the share of queries with a relevant document in the top k).",
    ),
    progress: Progress = True,
    compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
    passages: bool = typer.Option(True, "--passages/--no-passages", help="Dense without --index: split documents "
                                  "longer than the model's window into passages, each document scored by its best "
                                  "(as an index does); --no-passages: each document's first window."),
    index: Optional[Path] = typer.Option(None, "--index", help="Search this stored index (twotower index build)."),
    rerank: Optional[str] = typer.Option(
        None, "--rerank", help="Cross-encoder directory: re-rank the top 100 (default: a fitted model's own re-ranker "
        "when --retriever is not given; 'none': no re-ranking)."),
    rerank_depth: Optional[int] = typer.Option(None, "--rerank-depth", min=1,
                                               help="Documents per query re-ranked (default 100); needs --rerank."),
    hybrid_lambda: Optional[float] = typer.Option(None, "--lambda", help="Hybrid weight of dense (default: tuned)."),
    rerank_weight: Optional[float] = typer.Option(
        None, "--rerank-weight", help="Blend the re-ranker's z-scored scores with the first stage's: its share, 0-1 "
        "(default: a fitted model's choice, else 1: the re-ranker alone)."),
    fusion_norm: Optional[str] = typer.Option(
        None, "--fusion-norm", help="How --retriever hybrid normalises each side per query: minmax | zscore (default: "
        "a fitted model's choice, else minmax)."),
    multivector: Optional[int] = typer.Option(
        None, "--multivector", min=1,
        help="ME-BERT m (without --index; default: the m the model was trained with, else 8)."),
    prf_depth: Optional[int] = typer.Option(None, "--prf-depth", help=PRF_DEPTH_HELP),
    prf_weight: Optional[float] = typer.Option(None, "--prf-weight", help=PRF_WEIGHT_HELP),
    runtime: str = typer.Option("auto", "--runtime", help=RUNTIME_HELP),
) -> None:
    """Evaluate a retriever on a BEIR split and print its metrics."""
    if rerank_depth is not None and rerank is None:
        fail(TwoTowerError("--rerank-depth sets how many documents --rerank re-ranks: pass --rerank DIR or drop it"))
    try:
        check_outputs(("--out", out), ("--run", run_file), data=data)  # before any loading: fail now, not later
        chosen = tt.Index.open(index, model=model, device=device, precision=precision) if index else None
        result = tt.evaluate(
            chosen, data, split=split, mode=retriever, model=None if index else model,
            k=top_k, metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()), batch_size=batch_size,
            precision=precision, device=device, query_max_length=query_max_length, doc_max_length=doc_max_length,
            pooling=pooling, k1=k1, b=b, strict=strict, show_progress=progress, rerank=rerank,
            rerank_depth=100 if rerank_depth is None else rerank_depth, lam=hybrid_lambda, multivector=multivector,
            compile=compile_, language=language, norm=fusion_norm, rerank_weight=rerank_weight, passages=passages,
            prf_depth=prf_depth, prf_weight=prf_weight, runtime=runtime)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    for message in result.warnings:
        warn(message)
    try:
        result.save(out, run_file=run_file)  # a full disk: "no space left on <path>", nothing half-written
    except TwoTowerError as exc:
        fail(exc)
    payload = result.to_json()
    console.print(metrics_table([payload], title=f"{payload['dataset']} / {split} ({payload['num_queries']} queries)"))
    console.print(choices_line(payload), soft_wrap=True)


def table_cmd(results: list[Path] = typer.Argument(..., help="Result JSON files written by 'twotower eval --out'.")) -> None:
    """Print several evaluation results side by side."""
    rows = []
    for path in results:
        try:
            rows.append(tt.read_result(path))
        except TwoTowerError as exc:
            fail(exc)
    console.print(metrics_table(rows))
    for path, row in zip(results, rows):  # what each ran with (results written before these keys: nothing to say)
        if "mode" in row:
            console.print(f"{path.name}: {choices_line(row)}", soft_wrap=True)
