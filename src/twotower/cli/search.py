"""``twotower search``: the top-k documents of a stored index for one query, as a table or JSON lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import DEVICE_HELP, PRF_DEPTH_HELP, PRF_WEIGHT_HELP, console, fail
from twotower.errors import TwoTowerError
from twotower.cli.helpers import read_filter_file

FILTER_HELP = ('Only documents whose metadata pass this filter: JSON such as \'{"source": "wiki", "year": {"$gte": '
               '2020}}\' ($eq $ne $gt $gte $lt $lte $in $nin $exists, $and / $or lists, $not, dotted paths, '
               '{"$text": {"$contains": "phrase"}}: an exact substring of the text; at most 32 levels of $and / $or, '
               '1,024 conditions, 4,096 $in values), or @FILE.json to read it from a file (a regular file of at most '
               '1 MiB). Docs: "Your documents: metadata and filters".')


def read_filter(value: str | None):
    """The ``--filter`` option parsed (JSON text, or ``@path`` to a JSON file): a ``twotower.Filter`` or None;
    every error names ``--filter``."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):  # a regular file of at most 1 MiB, UTF-8 (a byte-order mark is dropped)
        text = read_filter_file(Path(value[1:]), "--filter")
    try:
        return tt.parse_filter(text)
    except TwoTowerError as exc:
        raise TwoTowerError(f"--filter: {exc}") from None


def register(app: typer.Typer) -> None:
    app.command("search")(search_cmd)


def search_cmd(
    query: str = typer.Argument(..., help="Query text."),
    index: Path = typer.Option(..., "--index", help="Index directory."),
    k: int = typer.Option(10, "-k", "--top-k", min=1),
    mode: Optional[str] = typer.Option(
        None, help="dense | bm25 | hybrid | rrf (default: the mode 'twotower fit' chose for the model, else dense)"),
    lam: Optional[float] = typer.Option(None, "--lambda", help="Hybrid weight of dense (default: tuned value)."),
    fusion_norm: Optional[str] = typer.Option(
        None, "--fusion-norm", help="How --mode hybrid normalises each side per query: minmax | zscore (default: "
        "the fitted model's, else minmax)."),
    prf_depth: Optional[int] = typer.Option(None, "--prf-depth", help=PRF_DEPTH_HELP),
    prf_weight: Optional[float] = typer.Option(None, "--prf-weight", help=PRF_WEIGHT_HELP),
    ef_search: Optional[int] = typer.Option(None, "--ef-search", min=1,
                                            help="HNSW efSearch (default: the index's, calibrated at build)."),
    nprobe: Optional[int] = typer.Option(None, "--nprobe", min=1,
                                         help="IVF lists probed (default: the index's, calibrated at build)."),
    rerank: Optional[Path] = typer.Option(
        None, "--rerank", help="Cross-encoder directory: re-rank the hits (default: the fitted model's re-ranker "
        "when --mode is not given; 'none': no re-ranking)."),
    rerank_depth: Optional[int] = typer.Option(None, "--rerank-depth", min=1,
                                               help="Hits re-ranked (default 100); needs --rerank."),
    filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines (rank, id, score, title, metadata, "
                                 "passages: the best passage's text with its start and end in the document's text) "
                                 "instead of a table."),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
) -> None:
    """Print the top-k documents for QUERY: rank, id, score, title (--json: with their metadata)."""
    from rich.table import Table

    try:
        if not query.strip():
            raise TwoTowerError("QUERY is empty: give the text to search for, e.g. twotower search --index DIR "
                                "'how is green tea made'")
        if rerank_depth is not None and rerank is None:
            raise TwoTowerError("--rerank-depth sets how many hits --rerank re-ranks: pass --rerank DIR or drop it")
        flt = read_filter(filter_)  # before the index and the model are loaded
        if lam is not None and mode not in (None, "hybrid"):  # mode None: the fitted model's, checked below
            raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {mode} does not use "
                                "it: drop --lambda or pass --mode hybrid")
        opened = tt.Index.open(index, device=device)
        resolved, _ = opened.resolve(mode, lam)  # a fitted model's own mode unless given
        if lam is not None and resolved != "hybrid":
            raise TwoTowerError(f"--lambda weighs dense against BM25 in --mode hybrid; --mode {resolved} does not "
                                "use it: drop --lambda or pass --mode hybrid")
        if fusion_norm is not None and resolved != "hybrid":
            raise TwoTowerError(f"--fusion-norm normalises the two sides of --mode hybrid; --mode {resolved} does "
                                "not use it: drop it or pass --mode hybrid")
        if prf_weight is not None and prf_depth is None:
            raise TwoTowerError("--prf-weight needs --prf-depth (how many top documents feed back)")
        if prf_depth is not None and resolved == "bm25":
            raise TwoTowerError("--prf-depth feeds the top documents' vectors back into a dense query; --mode bm25 "
                                "has none: drop it or pass --mode dense | hybrid | rrf")
        hits = opened.search(query, k, mode=mode, lam=lam, ef_search=ef_search, nprobe=nprobe, norm=fusion_norm,
                             prf_depth=prf_depth, prf_weight=prf_weight,
                             rerank=str(rerank) if rerank is not None else None, rerank_depth=rerank_depth,
                             filter=flt)
        mode = resolved
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    if not hits and not as_json:
        why = " (BM25 returns only documents sharing a term with the query)" if mode == "bm25" else ""
        why += " under --filter" if flt is not None and not flt.empty else ""
        console.print(f"{mode}: no document matches {query!r}{why}", highlight=False, soft_wrap=True)
        return
    if as_json:
        for rank, h in enumerate(hits, start=1):
            print(json.dumps({"rank": rank, "id": h.id, "score": round(h.score, 6), "title": h.title,
                              "metadata": h.metadata, "passages": [p.to_dict() for p in h.passages]}))
        return
    table = Table(title=f"{mode}: {query}")
    for name in ("rank", "id", "score", "title", "passage"):
        table.add_column(name, justify="right" if name in ("rank", "score") else "left",
                         ratio=3 if name == "passage" else None, overflow="fold" if name == "id" else "ellipsis")
    for rank, h in enumerate(hits, start=1):
        table.add_row(str(rank), h.id, f"{h.score:.4f}", h.title, _snippet(h))
    console.print(table)


def _snippet(hit, width: int = 160) -> str:
    """The start of the hit's best passage on one line (``…`` where it is cut), with its offset (and page)."""
    p = hit.passage
    if p is None:
        return ""
    text = " ".join(p.text.split())
    text = text if len(text) <= width else text[: width - 1].rstrip() + "…"
    where = f"@{p.start}" + (f" p.{p.page}" if p.page is not None else "")
    return f"{text} [{where}]"
