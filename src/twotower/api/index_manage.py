"""Managing an index's documents without a query: :meth:`Index.list`, :meth:`~Index.count`, :meth:`~Index.get`,
:meth:`~Index.delete` (by id or filter) and :meth:`~Index.update` (metadata only), on either backend
(:mod:`twotower.retrieval.manage` holds the semantics). :class:`~twotower.Index` takes them from :class:`Managing`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from twotower.api._errors import user_errors
from twotower.checks import check_number, flag
from twotower.errors import TwoTowerError

__all__ = ["Managing", "Page"]


def locked(method):
    """``method`` run under the index's lock: a tokenizer (Hugging Face's fast ones) and a version switch are not
    safe under concurrent calls, so one Index serves one call at a time (threads may share it)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


@dataclass
class Page:
    """One page of :meth:`Index.list`: the ``ids`` in id order, their ``documents`` (:class:`~twotower.Document`;
    ``[]`` when listed without), ``total`` (how many documents the filter lets through) and ``next`` (pass it as
    ``after=`` for the next page; None on the last).

    Example::

        page = index.list(limit=2)
        print(page.ids, page.total, page.next)
    """

    ids: list[str]
    total: int
    next: str | None = None
    documents: list = field(default_factory=list)


def _ids(ids, what: str) -> list[str] | None:
    if ids is None:
        return None
    if isinstance(ids, str):
        raise TwoTowerError(f"{what} takes a list of ids, not a single string: ids=[{ids!r}]")
    ids = list(ids)
    bad = next((i for i in ids if not isinstance(i, str)), None)
    if bad is not None:
        raise TwoTowerError(f"ids: a list of document ids (strings); {bad!r} is a {type(bad).__name__}")
    return ids


def _documents(records) -> list:
    from twotower.data.beir import Document

    return [Document(r["_id"], r["title"], r["text"], r.get("metadata") or {}) for r in records]


class Managing:
    """The document-management methods of :class:`~twotower.Index` (``self._searcher``, ``self._lock``)."""

    def _live(self):
        self._searcher.refresh()
        return self._searcher.store

    @user_errors
    def documents(self, ids: Sequence[str]) -> list[dict]:
        """The stored documents ``{"_id", "title", "text", **metadata}`` for ``ids`` (an unknown id is an error).

        Example::

            doc = index.documents([index.added_ids[0]])[0]
            print(doc["_id"], doc["text"])
        """
        if isinstance(ids, str):
            raise TwoTowerError("documents takes a list of ids, not a single string")
        self._searcher.refresh()
        store = self._searcher.store
        if hasattr(store, "prefetch"):  # a Milvus index: the documents in batched queries, not one each
            store.prefetch(list(ids))
        from twotower.api.dataset import stored_document

        return [stored_document(store, r) for r in store.rows(list(ids))]

    @user_errors
    @locked
    def count(self, filter=None) -> int:
        """How many documents the metadata ``filter`` lets through (all of them for None); the same filter language
        as :meth:`search`, ``$not`` and ``$text`` included.

        Example::

            print(index.count(), index.count({"kind": "tea"}), index.count({"$text": {"$contains": "green"}}))
        """
        from twotower.retrieval.manage import count

        return count(self._live(), filter)

    @user_errors
    @locked
    def list(self, filter=None, *, limit: int | None = 100, offset: int = 0, after: str | None = None,
             documents: bool = True) -> Page:
        """A :class:`Page` of the documents ``filter`` lets through, in id order: those after the id ``after`` (the
        previous page's ``next``), ``offset`` of them skipped, at most ``limit`` (None: all); ``documents=False``
        lists ids only.

        Example::

            page = index.list({"kind": "tea"}, limit=10)
            while page.next:
                page = index.list({"kind": "tea"}, limit=10, after=page.next)
        """
        # a whole float (2.0) counts as the number it is: the checked values are Python ints
        limit = check_number(limit, "limit", integer=True, minimum=1, optional=True)
        offset = check_number(offset, "offset", integer=True, minimum=0)
        if after is not None and not isinstance(after, str):
            raise TwoTowerError(f"{flag('after')}: the id the previous page ended with (its next), not "
                                f"{type(after).__name__}")
        from twotower.retrieval.manage import page, records

        store = self._live()
        ids, total, nxt = page(store, filter, offset=offset, limit=limit, after=after)
        return Page(ids, total, nxt, _documents(records(store, ids)) if documents and ids else [])

    @user_errors
    @locked
    def get(self, ids: Sequence[str] | None = None, *, filter=None, limit: int | None = None) -> list:
        """The stored documents (:class:`~twotower.Document`: ``id``, ``title``, ``text``, ``metadata``) that
        ``filter`` lets through — of ``ids`` when given (in their order; an unknown id is an error), else of the
        whole index in id order, at most ``limit``. No query, no encoding.

        Example::

            for doc in index.get(filter={"year": {"$gte": 2020}}):
                print(doc.id, doc.metadata)
        """
        ids = _ids(ids, "get")
        limit = check_number(limit, "limit", integer=True, minimum=1, optional=True)
        from twotower.retrieval.manage import records, selected_ids

        store = self._live()
        chosen = selected_ids(store, filter, ids)
        return _documents(records(store, chosen[:limit] if limit is not None else chosen))

    @user_errors
    @locked
    def delete(self, ids: Sequence[str] | None = None, *, filter=None, lock_timeout: float | None = 60.0) -> list:
        """Delete the documents ``filter`` lets through (of ``ids`` when given; a non-empty filter or ids are
        required) in one atomic write — a new version locally, one committed write on Milvus — and return their
        ids (``[]``: nothing matched, nothing written), each once. Deleting every document is refused, and so is an
        id given twice. ``lock_timeout``: as in :meth:`add`.

        Example::

            deleted = index.delete(filter={"kind": "coffee"})
        """
        ids = _ids(ids, "delete")
        from twotower.retrieval.index.lock import lock_timeout as waiting
        from twotower.retrieval.manage import delete

        with waiting(lock_timeout):
            _, deleted = delete(self._live(), filter, ids)
        self._searcher.refresh()
        return deleted

    @user_errors
    @locked
    def update(self, ids: Sequence[str] | None = None, *, filter=None, metadata=None, merge: bool = True,
               unset: Sequence[str] = (), lock_timeout: float | None = 60.0, all_documents: bool = False) -> list:
        """Change the metadata of the documents ``filter`` lets through (of ``ids`` when given; neither, or a filter
        that lets everything through: refused unless ``all_documents=True``, as a delete refuses it) and nothing else — no re-encoding; vectors, BM25 and texts stay as they are — in one atomic write;
        returns the ids updated. ``metadata``: one dict for all, or a list of dicts, one per id; ``merge`` (default)
        sets its keys over the old metadata, ``merge=False`` replaces the metadata whole (``merge`` a bool: ``"no"``
        is refused, not taken as true); ``unset``: top-level keys removed (a list of strings, whether or not a
        document holds them). An id given twice is refused. The result follows the metadata rules of :meth:`add`.

        Example::

            index.update(filter={"kind": "tea"}, metadata={"reviewed": True})
            index.update(["c2"], unset=["origin"])
        """
        ids = _ids(ids, "update")
        from twotower.retrieval.manage import metadata_change, update

        change = metadata_change(metadata, ids, merge, unset)
        from twotower.retrieval.index.lock import lock_timeout as waiting

        with waiting(lock_timeout):
            _, updated = update(self._live(), change, filter, ids, every=all_documents)
        self._searcher.refresh()
        return updated
