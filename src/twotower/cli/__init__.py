"""The ``twotower`` command line: parse arguments, call the library, print."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

# Nothing is fetched from a hub unless the user asks for it (HF_HUB_OFFLINE=0).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import typer
from rich.table import Table

import twotower as tt

from twotower.cli.console import (BATCH_HELP, COMPILE_HELP, DEVICE_HELP, LANGUAGE_HELP, PRF_DEPTH_HELP, PRF_WEIGHT_HELP,
                              RUNTIME_HELP)
from twotower.cli.console import console, warn
from twotower.cli.console import fail as _fail
from twotower.errors import TwoTowerError

app = typer.Typer(help="Train, index, evaluate and serve dual-encoder retrievers.", no_args_is_help=True)
data_app = typer.Typer(help="Find or download BEIR data sets.", no_args_is_help=True)
app.add_typer(data_app, name="data")


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


@app.callback()
def main(ctx: typer.Context,
         verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages.")) -> None:
    from twotower.checks import reset_names, use_cli_names

    token = use_cli_names()  # the library's messages name options as flags (--epochs, not epochs=)
    ctx.call_on_close(lambda: reset_names(token))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@app.command("eval")
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
    progress: bool = typer.Option(True, help="Show progress bars."),
    compile_: bool = typer.Option(False, "--compile", help=COMPILE_HELP),
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
        _fail(TwoTowerError("--rerank-depth sets how many documents --rerank re-ranks: pass --rerank DIR or drop it"))
    try:
        tt.check_outputs(("--out", out), ("--run", run_file), data=data)  # before any loading: fail now, not later
        chosen = tt.Index.open(index, model=model, device=device, precision=precision) if index else None
        result = tt.evaluate(
            chosen, data, split=split, mode=retriever, model=None if index else model,
            k=top_k, metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()), batch_size=batch_size,
            precision=precision, device=device, query_max_length=query_max_length, doc_max_length=doc_max_length,
            pooling=pooling, k1=k1, b=b, strict=strict, show_progress=progress, rerank=rerank,
            rerank_depth=100 if rerank_depth is None else rerank_depth, lam=hybrid_lambda, multivector=multivector,
            compile=compile_, language=language, norm=fusion_norm, rerank_weight=rerank_weight,
            prf_depth=prf_depth, prf_weight=prf_weight, runtime=runtime)
    except (TwoTowerError, ValueError) as exc:
        _fail(exc)
    for message in result.warnings:
        warn(message)
    try:
        result.save(out, run_file=run_file)  # a full disk: "no space left on <path>", nothing half-written
    except TwoTowerError as exc:
        _fail(exc)
    payload = result.to_json()
    console.print(metrics_table([payload], title=f"{payload['dataset']} / {split} ({payload['num_queries']} queries)"))


@app.command("table")
def table_cmd(results: list[Path] = typer.Argument(..., help="Result JSON files written by 'twotower eval --out'.")) -> None:
    """Print several evaluation results side by side."""
    rows = []
    for path in results:
        try:
            rows.append(tt.read_result(path))
        except TwoTowerError as exc:
            _fail(exc)
    console.print(metrics_table(rows))


@data_app.command("fetch")
def data_fetch(
    name: str = typer.Argument("scifact", help="BEIR data set name."),
    cache: Path = typer.Option(Path(".cache/data"), help="Folder to download into."),
) -> None:
    """Download a BEIR data set (checksum verified) and print its directory."""
    try:
        console.print(str(tt.fetch_beir(name, cache)), highlight=False, soft_wrap=True)
    except TwoTowerError as exc:
        _fail(exc)


@data_app.command("locate")
def data_locate(
    path: Path = typer.Argument(..., help="A BEIR directory; if missing, the data set named by its last part is fetched."),
    cache: Path = typer.Option(Path(".cache/data"), help="Folder to download into."),
) -> None:
    """Print a usable data directory: PATH itself, or the cached/downloaded copy of its data set."""
    try:
        console.print(str(tt.locate_beir(path, cache)), highlight=False, soft_wrap=True)
    except TwoTowerError as exc:
        _fail(exc)


# Each module below defines ``register(app)`` adding its commands; heavy imports stay inside commands.
COMMAND_MODULES: tuple[str, ...] = (
    "twotower.cli.models",
    "twotower.cli.train",
    "twotower.cli.pretrain",
    "twotower.cli.fit",
    "twotower.cli.index",
    "twotower.cli.analyze",
    "twotower.cli.serve",
)


def _register_commands() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register_commands()

if __name__ == "__main__":  # pragma: no cover
    app()
