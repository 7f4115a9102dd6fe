"""Store listing edge cases (issue #71 items 13 and 17), each against a plain Python reference:

- ``POST /list`` with ``ids`` and ``offset > 0``: the page is ``ids[offset:offset + limit]`` of the given ids (those
  the filter lets through, in the order given), ``total`` counts all of them, and ``next`` is null (a list of ids is
  paged by ``offset`` alone);
- a local ``index.list(limit=len(docs))`` is the last page: ``next`` is None (only the Milvus tests caught a last page
  that claimed a next), and so is every page that reaches the end, by ``limit``, ``offset`` or ``after``; a page that
  does not reach it names its last id.
"""

from __future__ import annotations

import pytest
from conftest import TINY_CORPUS, serve_client

import twotower as tt

IDS = ["d5", "d2", "d6", "d1", "d3"]  # not in id order: the page keeps the order given


@pytest.fixture(scope="module")
def client(served_index_built):
    return serve_client(served_index_built, None)


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 10])
def test_http_list_of_ids_pages_by_offset_like_a_python_slice(client, limit):
    for offset in range(len(IDS) + 2):
        res = client.post("/list", json={"ids": IDS, "offset": offset, "limit": limit})
        assert res.status_code == 200, res.text
        body = res.json()
        want = IDS[offset:offset + limit]
        assert body["ids"] == want, (offset, limit)
        assert [d["id"] for d in body["documents"]] == want
        assert body["total"] == len(IDS) and body["next"] is None


def test_http_list_of_ids_with_a_filter_pages_the_ids_that_pass(client):
    texts = {d["_id"]: d["text"] for d in TINY_CORPUS}
    flt = {"$text": {"$contains": " is "}}
    passing = [d for d in IDS if " is " in texts[d]]
    assert 1 < len(passing) < len(IDS)
    for offset in range(len(passing) + 1):
        for limit in (1, 2, len(IDS)):
            body = client.post("/list", json={"ids": IDS, "filter": flt, "offset": offset, "limit": limit,
                                              "documents": False}).json()
            assert body["ids"] == passing[offset:offset + limit] and body["total"] == len(passing)
            assert body["documents"] == [] and body["next"] is None


def test_local_last_page_has_no_next(served_index_built):
    index = tt.Index.open(served_index_built)
    ordered = sorted(d["_id"] for d in TINY_CORPUS)
    n = len(ordered)
    page = index.list(limit=n)
    assert page.ids == ordered and page.total == n and page.next is None
    assert index.list(limit=n + 5).next is None and index.list(limit=None).next is None
    for offset in range(n + 1):
        for limit in range(1, n + 2):
            page = index.list(limit=limit, offset=offset)
            want = ordered[offset:offset + limit]
            assert page.ids == want
            assert page.next == (want[-1] if offset + limit < n else None), (offset, limit)
    for after in ordered:  # by cursor: the pages after each id
        rest = ordered[ordered.index(after) + 1:]
        for limit in range(1, n + 1):
            page = index.list(limit=limit, after=after)
            assert page.ids == rest[:limit]
            assert page.next == (rest[limit - 1] if limit < len(rest) else None), (after, limit)
    # walking the cursor visits every id once and stops
    seen, after = [], None
    while True:
        page = index.list(limit=2, after=after)
        seen += page.ids
        if page.next is None:
            break
        after = page.next
    assert seen == ordered


def test_http_last_page_has_no_next(client):
    ordered = sorted(d["_id"] for d in TINY_CORPUS)
    body = client.post("/list", json={"limit": len(ordered), "documents": False}).json()
    assert body["ids"] == ordered and body["next"] is None and body["total"] == len(ordered)
    body = client.post("/list", json={"limit": len(ordered) - 1, "documents": False}).json()
    assert body["ids"] == ordered[:-1] and body["next"] == ordered[-2]
