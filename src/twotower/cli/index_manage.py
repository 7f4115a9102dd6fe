"""``twotower index list|count|get|delete|update``: an index's documents without a query (``tt.Index.list`` …)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

import twotower as tt
from twotower.cli.console import console, err_console, fail
from twotower.cli.helpers import read_json_option
from twotower.cli.search import read_filter
from twotower.errors import TwoTowerError

FILTER_HELP = ('A metadata filter (JSON, or @file.json), as for search: \'{"kind": "tea"}\', $not, '
               '{"$text": {"$contains": "phrase"}} (an exact substring of the text).')
LOCK_HELP = "Seconds to wait while another writer holds the index's lock (0: at once)."
INDEX = typer.Option(..., "--index", help="Index directory.")


def _record(doc) -> str:
    return json.dumps({"_id": doc.id, "title": doc.title, "text": doc.text, "metadata": doc.metadata},
                      ensure_ascii=False)


def index_count(index: Path = INDEX, filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP)) -> None:
    """Print how many documents pass the filter (all of them without one)."""
    try:
        print(tt.Index.open(index).count(read_filter(filter_)))
    except (TwoTowerError, ValueError) as exc:
        fail(exc)


def index_list(
    index: Path = INDEX,
    filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP),
    limit: int = typer.Option(100, "--limit", min=1, help="Documents per page."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many (after --after)."),
    after: Optional[str] = typer.Option(None, "--after", help="Start after this id: the previous page's next."),
    ids_only: bool = typer.Option(False, "--ids-only", help="Ids only, no documents."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object: ids, total, next, documents."),
) -> None:
    """List documents in id order, a page at a time (one JSON line per document; the next page's --after on
    stderr)."""
    try:
        page = tt.Index.open(index).list(read_filter(filter_), limit=limit, offset=offset, after=after,
                                         documents=not ids_only)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps({"ids": page.ids, "total": page.total, "next": page.next,
                          "documents": [json.loads(_record(d)) for d in page.documents]}, ensure_ascii=False))
        return
    for line in (page.ids if ids_only else map(_record, page.documents)):
        print(line)
    more = f"; next page: --after {page.next}" if page.next else ""
    err_console.print(f"{len(page.ids)} of {page.total} document(s){more}", highlight=False)


def index_get(
    index: Path = INDEX,
    ids: Optional[list[str]] = typer.Argument(None, help="Document ids (default: every document the filter passes)."),
    filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most this many documents."),
) -> None:
    """Print stored documents (JSON lines: _id, title, text, metadata) by id and/or filter; no query."""
    try:
        docs = tt.Index.open(index).get(ids or None, filter=read_filter(filter_), limit=limit)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    for doc in docs:
        print(_record(doc))


def index_delete(
    index: Path = INDEX,
    ids: Optional[list[str]] = typer.Argument(None, help="Document ids (with --filter: those of them it passes)."),
    filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP + " Required without ids."),
    lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
) -> None:
    """Delete the documents a filter selects (and/or ids), in one atomic write."""
    try:
        flt = read_filter(filter_)
        opened = tt.Index.open(index)
        deleted = opened.delete(ids or None, filter=flt, lock_timeout=lock_timeout)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{index}: deleted {len(deleted)} document(s); version {opened.info()['live_version']}, "
                  f"{len(opened)} documents", highlight=False)


def index_update(
    index: Path = INDEX,
    ids: Optional[list[str]] = typer.Argument(None, help="Document ids (default: the documents --filter passes)."),
    filter_: Optional[str] = typer.Option(None, "--filter", help=FILTER_HELP),
    metadata: Optional[str] = typer.Option(None, "--metadata", help='JSON object set on each document, e.g. '
                                           '\'{"reviewed": true}\'.'),
    replace_metadata: bool = typer.Option(False, "--replace-metadata", help="Replace the metadata whole instead of "
                                          "setting --metadata's keys over it."),
    unset: Optional[list[str]] = typer.Option(None, "--unset", help="Remove this top-level key (repeatable)."),
    lock_timeout: float = typer.Option(60.0, "--lock-timeout", help=LOCK_HELP),
    every: bool = typer.Option(False, "--all", help="Change every document (without ids or a narrowing --filter "
                               "an update is refused)."),
) -> None:
    """Change documents' metadata only (no re-encoding: vectors, BM25 and texts untouched), in one atomic write."""
    try:
        flt = read_filter(filter_)
        meta = read_json_option(metadata, "--metadata") if metadata is not None else None
        opened = tt.Index.open(index)
        updated = opened.update(ids or None, filter=flt, metadata=meta, merge=not replace_metadata,
                                unset=unset or (), lock_timeout=lock_timeout, all_documents=every)
    except (TwoTowerError, ValueError) as exc:
        fail(exc)
    console.print(f"{index}: updated {len(updated)} document(s); version {opened.info()['live_version']}",
                  highlight=False)


def add_commands(group: typer.Typer) -> None:
    for name, command in (("list", index_list), ("count", index_count), ("get", index_get),
                          ("delete", index_delete), ("update", index_update)):
        group.command(name)(command)
