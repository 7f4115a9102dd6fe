"""A store's documents without a query: which match a filter (ordered by id, paged), how many, their records,
deleting them and changing their metadata — on either backend, with the same meaning.

- **Order**: documents are listed by id (Unicode code point order, as Python sorts strings), on both backends, so a
  page's ``after`` cursor (the last id it listed) goes on keeping its place while documents are added or removed.
- **Selection**: a metadata filter (:mod:`twotower.retrieval.filters`, ``$not`` and ``$text`` included) and/or a list
  of ids (an unknown id is an error); both given: the ids that pass the filter.
- **Writes** are one atomic write each: locally one new version (delete: the version without the rows; metadata:
  :mod:`.index.relabel`, vectors, FAISS and BM25 carried unchanged), on Milvus one committed write
  (:mod:`.milvus.manage`). Deleting every document is refused (an index holds at least one).

Functions take an opened store (either backend) and return plain data; ``tt.Index`` (:mod:`twotower.api.index_manage`),
the CLI and the service call them. A filter is parsed once, by the function called (a :class:`Filter` already parsed
is taken as it is), and handed on parsed to every layer inside.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import numpy as np

from twotower.errors import TwoTowerError
from twotower.retrieval.filters import Filter, parse_filter
from twotower.retrieval.index.errors import WouldEmptyError
from twotower.retrieval.index.lock import writer_lock

Records = list[dict]  # {"_id", "title", "text"[, "metadata"]} per document, as store.document gives them


def is_milvus(store) -> bool:
    return hasattr(store, "filter_expression")


class _IdsInOrder:
    """``doc_ids`` read through ``order`` (rows), for bisecting a cursor."""

    def __init__(self, doc_ids, order: np.ndarray) -> None:
        self.doc_ids, self.order = doc_ids, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> str:
        return self.doc_ids[int(self.order[i])]


def rows_by_id(store) -> np.ndarray:
    """The local version's rows in id order (computed once per version)."""
    order = getattr(store, "_rows_by_id", None)
    if order is None:
        ids = store.doc_ids
        order = np.asarray(sorted(range(len(ids)), key=ids.__getitem__), dtype=np.int64)
        store._rows_by_id = order
    return order


def _mask(store, flt: Filter) -> np.ndarray | None:
    from twotower.retrieval.searcher import filter_mask

    return filter_mask(store, flt)


def _local_selected(store, flt: Filter, ids: Sequence[str] | None) -> np.ndarray:
    """Rows selected, in id order (ids given: in their order)."""
    mask = _mask(store, flt)
    if ids is not None:
        rows = np.asarray(store.rows(list(ids)), dtype=np.int64)
        return rows if mask is None else rows[mask[rows]]
    order = rows_by_id(store)
    return order if mask is None else order[mask[order]]


def selected_ids(store, flt=None, ids: Sequence[str] | None = None) -> list[str]:
    """The ids of the documents selected (module docstring), in id order, or in the order of ``ids``."""
    flt = parse_filter(flt)
    if is_milvus(store):
        from twotower.retrieval.milvus.manage import matching_ids

        return matching_ids(store, flt, ids)
    return [store.doc_ids[int(r)] for r in _local_selected(store, flt, ids)]


def count(store, flt=None) -> int:
    """How many documents pass ``flt``."""
    flt = parse_filter(flt)
    if flt.empty:
        return len(store)
    if is_milvus(store):
        return store.count(store.filter_expression(flt))
    return int(_mask(store, flt).sum())


def page(store, flt=None, *, offset: int = 0, limit: int | None = None,
         after: str | None = None) -> tuple[list[str], int, str | None]:
    """``(ids, total, next)``: the ids of one page of the documents passing ``flt`` in id order — those after the id
    ``after`` (a cursor), then ``offset`` skipped, at most ``limit`` —, how many pass in all, and the cursor of the
    next page (None when this is the last)."""
    flt = parse_filter(flt)
    if is_milvus(store):  # Milvus selects the ids above the cursor itself
        from twotower.retrieval.milvus.manage import matching_ids

        ordered: Sequence[str] = matching_ids(store, flt, after=after)
        start, total = 0, (count(store, flt) if after is not None else len(ordered))
    else:
        ordered = _IdsInOrder(store.doc_ids, _local_selected(store, flt, None))
        start = bisect.bisect_right(ordered, after) if after is not None else 0
        total = len(ordered)
    stop = len(ordered) if limit is None else min(len(ordered), start + offset + limit)
    ids = [ordered[i] for i in range(min(start + offset, stop), stop)]
    return ids, total, (ids[-1] if ids and stop < len(ordered) else None)


def records(store, ids: Sequence[str]) -> Records:
    """The stored records of ``ids`` (known ids), in their order."""
    if is_milvus(store):
        from twotower.retrieval.milvus.manage import read_records

        return read_records(store, ids)
    return [store.document(r) for r in store.rows(list(ids))]


def unique_ids(ids: Sequence[str] | None, what: str) -> None:
    """Refuse an id given twice to one write (``what``: ``"delete"`` / ``"update"``): a repeat would be counted
    twice, and with a list of metadata one per id, one of its two dicts would be dropped without a word."""
    if ids is None:
        return
    seen: set[str] = set()
    for doc_id in ids:
        if doc_id in seen:
            raise TwoTowerError(f"ids: {doc_id!r} is given more than once; {what} takes each id once: drop the "
                                "repeat" + (" (and its metadata)" if what == "update" else ""))
        seen.add(doc_id)


def unset_keys(unset) -> tuple[str, ...]:
    """``unset`` (the top-level metadata keys :func:`update` removes) as a tuple of strings; None: none. A single
    string, or a key that is not a string (a list, a number), is refused naming it, whether or not any document
    holds metadata."""
    if unset is None:
        return ()
    if isinstance(unset, str):
        raise TwoTowerError(f"unset takes a list of keys, not a single string: unset=[{unset!r}]")
    if isinstance(unset, (dict, bytes)) or not hasattr(unset, "__iter__"):
        raise TwoTowerError(f"unset: a list of top-level metadata keys (strings), not a {type(unset).__name__}")
    keys = tuple(unset)
    bad = [k for k in keys if not isinstance(k, str)][:1]
    if bad:
        bad = bad[0]
        raise TwoTowerError(f"unset: a list of top-level metadata keys (strings); {bad!r} is a "
                            f"{type(bad).__name__}, not a key")
    return keys


def _nothing_left(store, n: int) -> None:
    if n and n >= len(store):
        raise WouldEmptyError(f"{store.root}: the selection holds all {len(store)} documents, and an index keeps at "
                              "least one: narrow the filter (or build a new index)")


def delete(store, flt=None, ids: Sequence[str] | None = None, *, keep: int = 2):
    """Delete the documents selected (module docstring) in one write: ``(the new store, the ids deleted)``; nothing
    selected: ``(store, [])`` and no write. An id given twice is refused (it would be reported deleted twice)."""
    flt = parse_filter(flt)
    if ids is None and flt.empty:
        raise TwoTowerError("delete needs ids or a non-empty filter (an empty filter would select every document)")
    unique_ids(ids, "delete")
    if is_milvus(store):
        from twotower.retrieval.milvus.manage import delete_where

        return delete_where(store, flt, ids, keep=keep)
    with writer_lock(store.root):
        live = store.refresh()
        rows = _local_selected(live, flt, ids)
        if not len(rows):
            return live, []
        _nothing_left(live, len(rows))
        keep_mask = np.ones(len(live), dtype=bool)
        keep_mask[rows] = False
        deleted = [live.doc_ids[int(r)] for r in rows]
        return live._write(keep_mask, None, keep, False), deleted


def metadata_change(metadata, ids: list[str] | None, merge: bool, unset: Sequence[str]):
    """The change :func:`update` applies: ``(id, old metadata) -> new metadata`` — ``metadata`` (one dict, or a list
    of dicts aligned with ``ids``) set over the old metadata (``merge``) or instead of it, then the keys ``unset``
    removed; the result checked by the metadata rules (:mod:`twotower.data.metadata`). ``merge`` must be a bool,
    ``unset`` strings (:func:`unset_keys`), ``ids`` each once (:func:`unique_ids`): all checked here, before any
    document is read."""
    from twotower.checks import check_bool, flag
    from twotower.data.metadata import check_metadata

    unset = unset_keys(unset)
    merge = check_bool(merge, "merge")
    unique_ids(ids, "update")
    if metadata is None and not unset:
        raise TwoTowerError("update needs metadata (a dict for every document, or one per id) or keys to unset")
    per_id: dict | None = None
    if isinstance(metadata, (list, tuple)):
        if ids is None or len(metadata) != len(ids):
            raise TwoTowerError(f"metadata as a list needs ids of the same length ({len(metadata)} dicts, "
                                f"{'no' if ids is None else len(ids)} ids)")
        per_id = {d: check_metadata(m, f"metadata[{i}]") for i, (d, m) in enumerate(zip(ids, metadata))}
    elif metadata is not None:
        metadata = check_metadata(metadata, flag("metadata"))  # --metadata on the command line

    def change(doc_id: str, old: dict) -> dict:
        given = (per_id[doc_id] if per_id is not None else metadata) or {}
        new = {**old, **given} if merge else dict(given)
        for key in unset:
            new.pop(key, None)
        return check_metadata(new, f"document '{doc_id}'")

    return change


def _every() -> str:
    """The explicit "all" of an update as the caller gives it: ``all_documents=True``, ``--all``."""
    from twotower.checks import switch

    return switch("all_documents", "--all")


Change = Callable[[str, dict], dict]  # (id, old metadata) -> new metadata (checked by the caller)


def update(store, change: Change, flt=None, ids: Sequence[str] | None = None, *, keep: int = 2,
           every: bool = False):
    """Give the documents selected the metadata ``change(id, old)`` returns, in one write that touches nothing else:
    ``(the new store, the ids updated)``; nothing selected: ``(store, [])``. An id given twice is refused. Neither
    ids nor a filter that narrows (one that lets everything through, ``{}`` or ``{"$and": [{}]}``) is refused
    unless ``every`` (the one rule of empty filters for writes: an explicit "all" or nothing)."""
    unique_ids(ids, "update")
    flt = parse_filter(flt)
    if ids is None and flt.empty and not every:
        raise TwoTowerError(f"update needs ids or a filter that narrows (an empty one would change every document): "
                            f"pass {_every()} to change them all")
    if is_milvus(store):
        from twotower.retrieval.milvus.manage import update_where

        return update_where(store, change, flt, ids, keep=keep)
    from twotower.retrieval.index.relabel import write_metadata

    with writer_lock(store.root):
        live = store.refresh()
        rows = _local_selected(live, flt, ids)
        if not len(rows):
            return live, []
        updates = {}
        for r in rows.tolist():
            doc = live.document(r)
            updates[r] = change(doc["_id"], doc.get("metadata") or {})
        final, manifest = write_metadata(live.root, live, updates, keep=keep)
        return type(live)._written(live.root, final, manifest), [live.doc_ids[r] for r in rows.tolist()]


__all__ = ["count", "delete", "is_milvus", "metadata_change", "page", "records", "rows_by_id", "selected_ids",
           "unique_ids", "unset_keys", "update"]
