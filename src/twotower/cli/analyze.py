"""``twotower analyze ...``: the papers' analyses as commands writing JSON + PNG plots to ``--out``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import BATCH_HELP, DEVICE_HELP, console, fail
from twotower.cli.helpers import check_output_dir, check_output_file
from twotower.cli.options import Progress, Seed
from twotower.errors import TwoTowerError

analyze_app = typer.Typer(help="The papers' analyses: projection fidelity, tower spaces, document length, "
                               "latency, and a markdown report.", no_args_is_help=True)

DEFAULT_OUT = Path("out/analysis")


def _command_line() -> str:
    return " ".join(["twotower", *sys.argv[1:]])


def rows_table(result: dict):
    """A rich table of an analysis' ``rows`` (the same columns and number format as the markdown report)."""
    from rich.table import Table

    rows = result.get("rows", [])
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (list, dict))))
    table = Table(title=result.get("title"))
    for c in cols:
        table.add_column(c, justify="right" if all(isinstance(r.get(c), (int, float)) or r.get(c) is None
                                                   for r in rows) else "left")
    for r in rows:
        table.add_row(*(_fmt(r.get(c)) for c in cols))
    return table


def _fmt(value) -> str:
    """A table cell, numbers as the markdown report writes them."""
    if value is None or isinstance(value, float) and value != value:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _finish(analyze, config, out: Path) -> None:
    result = analyze(config, out, command=_command_line())
    paths = result.get("written", [])
    if result.get("rows"):
        console.print(rows_table(result))
    for note in result.get("notes", []):
        console.print(f"- {note}", highlight=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in paths), highlight=False, soft_wrap=True)


def _run(fn):
    """Run ``fn`` and turn the library's errors into a clean exit."""
    try:
        return fn()
    except (TwoTowerError, ValueError) as exc:
        fail(exc)


@analyze_app.command("fidelity")
def fidelity_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR-format directory."),
    split: str = typer.Option("test", help="qrels split whose queries are used."),
    max_queries: Optional[int] = typer.Option(500, "--max-queries", min=1, help="Sample at most this many queries."),
    max_docs: int = typer.Option(20000, "--max-docs", min=2, help="Sample the collection down to this many documents."),
    pairs_per_query: int = typer.Option(100, "--pairs-per-query", min=1, help="d2 = BM25 ranks 2 … 1+N."),
    k_max: int = typer.Option(9472, "--k-max", min=1, help="Largest projection dimension."),
    k_step: int = typer.Option(32, "--k-step", min=1, help="Grid step of k (k_max must be a multiple)."),
    draws: int = typer.Option(3, "--draws", min=1, help="Independent projections per kind."),
    doc_lengths: str = typer.Option("16,32,64,128,256,full", "--doc-lengths",
                                    help="Truncation lengths in analysed tokens, comma-separated ('full' = none)."),
    recall_ks: str = typer.Option("64,128,256,512,1024,2048,4096,9472", "--recall-ks",
                                  help="k values for recall@r (multiples of --k-step, ≤ --k-max)."),
    target_accuracy: float = typer.Option(0.95, "--target-accuracy", help="Pairwise accuracy defining k* (1 − β)."),
    seed: int = typer.Option(0, help="Random seed (query/document sampling and projections)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for fidelity.json and the PNG plots."),
    progress: Progress = True,
) -> None:
    """Random-projection fidelity of BM25: k* vs. margin (Fig. 2), margins and recall by document length."""
    _run(lambda: check_output_dir(out, "--out"))  # before any loading

    def parse_ints(text: str, name: str, allow_full: bool = False) -> tuple:
        values = []
        for part in text.split(","):
            part = part.strip()
            if allow_full and part.lower() in ("full", "none"):
                values.append(None)
                continue
            try:
                values.append(int(part))
            except ValueError:
                raise TwoTowerError(f"{name}: '{part}' is not an integer"
                                    + (" or 'full'" if allow_full else "")) from None
            if values[-1] < 1:
                raise TwoTowerError(f"{name}: {values[-1]} is not a length; give whole numbers of at least 1")
        return tuple(values)

    def go() -> None:
        k_chunk = 512 if 512 % k_step == 0 else k_step * max(1, 512 // k_step)
        cfg = tt.FidelityConfig(
            data=data, split=split, max_queries=max_queries, max_docs=max_docs, pairs_per_query=pairs_per_query,
            k_max=k_max, k_step=k_step, k_chunk=k_chunk, draws=draws,
            doc_lengths=parse_ints(doc_lengths, "--doc-lengths", allow_full=True),
            recall_ks=parse_ints(recall_ks, "--recall-ks"), target_accuracy=target_accuracy, seed=seed,
            show_progress=progress,
        )
        _finish(tt.analyze_fidelity, cfg, out)

    _run(go)


@analyze_app.command("towers")
def towers_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR-format directory (questions and answers come from its qrels)."),
    model: Optional[list[str]] = typer.Option(None, "--model", help="Model directory; repeat for several "
                                                                    "(default: all-MiniLM-L6-v2)."),
    n: int = typer.Option(400, "--n", min=2, help="Questions and answers per model."),
    perplexity: float = typer.Option(30.0, help="t-SNE perplexity."),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    seed: Seed = 0,
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for towers.json and towers_tsne.png."),
    progress: Progress = True,
) -> None:
    """t-SNE of query- and document-tower embeddings per model, with a linear probe's separability."""
    _run(lambda: check_output_dir(out, "--out"))  # before any loading
    cfg = tt.TowersConfig(data=data, models=list(model) if model else [None], n=n, perplexity=perplexity,
                       precision=precision, device=device, seed=seed, show_progress=progress)
    _run(lambda: _finish(tt.analyze_towers, cfg, out))


@analyze_app.command("doclength")
def doclength_cmd(
    data: Path = typer.Option(..., "--data", help="BEIR-format directory."),
    split: str = typer.Option("test"),
    retriever: Optional[list[str]] = typer.Option(None, "--retriever", help="bm25 | dense; repeat (default: both)."),
    model: Optional[list[str]] = typer.Option(None, "--model", help="Dense model directory; repeat for several."),
    top_k: int = typer.Option(10, "--top-k", min=1),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help=BATCH_HELP),
    precision: str = typer.Option("auto", help="auto | fp32 | bf16"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for doclength.json and doclength.png."),
    progress: Progress = True,
) -> None:
    """Median length (words, tokens) of the top-10 documents each retriever returns (GTR §6.4)."""
    _run(lambda: check_output_dir(out, "--out"))  # before any loading
    cfg = tt.DocLengthConfig(data=data, split=split, retrievers=tuple(retriever) if retriever else ("bm25", "dense"),
                          models=list(model) if model else [None], top_k=top_k, batch_size=batch_size,
                          precision=precision, device=device, show_progress=progress)
    _run(lambda: _finish(tt.analyze_doclength, cfg, out))


@analyze_app.command("latency")
def latency_cmd(
    model: Optional[list[str]] = typer.Option(None, "--model", help="Model directory or registered name "
                                                                    "(minilm-l6, mpnet-base); repeat for several "
                                                                    "(default: all-MiniLM-L6-v2)."),
    precision: Optional[list[str]] = typer.Option(None, "--precision", help="Repeat; default: fp32 and auto."),
    query_length: int = typer.Option(128, "--query-length", min=2, help="Query length in tokens."),
    runs: int = typer.Option(100, "--runs", min=1, help="Timed batch-1 runs (after --warmup)."),
    warmup: int = typer.Option(10, "--warmup", min=0),
    data: Optional[Path] = typer.Option(None, "--data", help="BEIR directory whose first documents are encoded "
                                                             "(default: a synthetic text)."),
    n_docs: int = typer.Option(256, "--n-docs", min=1, help="Documents encoded for docs/s."),
    doc_batch_size: int = typer.Option(64, "--doc-batch-size", min=1),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for latency.json and latency.png."),
    progress: Progress = True,
) -> None:
    """Batch-1 query latency (p50/p95) and documents/s per model and precision (GTR §8)."""
    _run(lambda: check_output_dir(out, "--out"))  # before any loading
    cfg = tt.LatencyConfig(models=list(model) if model else [None],
                        precisions=tuple(precision) if precision else ("fp32", "auto"),
                        query_length=query_length, runs=runs, warmup=warmup, data=data, n_docs=n_docs,
                        doc_batch_size=doc_batch_size, device=device, show_progress=progress)
    _run(lambda: _finish(tt.analyze_latency, cfg, out))


@analyze_app.command("report")
def report_cmd(
    folder: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder holding the analyses' JSON and PNG files."),
    page: Optional[Path] = typer.Option(None, "--page", help="Markdown file to write (default: <out>/report.md)."),
) -> None:
    """Gather whatever analysis JSON the folder holds into one markdown page with the plots."""
    _run(lambda: check_output_file(page or folder / "report.md", "--page" if page else "--out"))
    path = _run(lambda: tt.build_report(folder, page))
    console.print(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(analyze_app, name="analyze")
