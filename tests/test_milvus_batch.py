"""Reads by id on the Milvus backend go in batched queries (issue #54), against the real Milvus Lite.

``documents()`` once cost one query per id (144–157 s for 5,211 ids), then one per 1,024 ids; Milvus Lite scans
every row of the collection for each ``id in [...]`` query, so the fewer queries the better: one per 16,384 ids
(Milvus' query result window), split in halves only when a server refuses a result as too large. Every Milvus query
is counted through a wrapper around the client, so a regression to per-id (or per-small-batch) round trips fails;
the answers are checked against the documents the index was built from (order as asked, repeats, unknown ids an
error naming them, removed documents gone, metadata only where a document has some)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from twotower.retrieval.index.errors import UnknownIdError  # noqa: E402
from twotower.retrieval.index.kinds import IndexSpec  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus import rows as milvus_rows  # noqa: E402
from twotower.retrieval.milvus.client import MilvusError  # noqa: E402
from twotower.retrieval.milvus.manage import matching_ids, read_records  # noqa: E402
from twotower.retrieval.milvus.store import MilvusStore, forget_client  # noqa: E402

N = 600
DIM = 8


def _corpus():
    rng = np.random.default_rng(3)
    ids = [f"d{i:04d}" for i in range(N)]
    titles = [f"title {i}" for i in range(N)]
    texts = [f"text of document {i} " + "word " * (i % 7) for i in range(N)]
    metadata = [{"n": i, "even": i % 2 == 0} if i % 3 else {} for i in range(N)]
    v = rng.standard_normal((N, DIM)).astype(np.float32)
    return NewDocs(ids, titles, texts, v / np.linalg.norm(v, axis=1, keepdims=True), metadata=metadata)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("milvusbatch")
    uri = str(root / "b.db")
    docs = _corpus()
    MilvusStore.build(root / "idx", docs, model={"name": "random"}, spec=IndexSpec(bm25=True), uri=uri,
                      collection="batch", show_progress=False)
    yield root / "idx", docs
    forget_client(uri)


class Counter:
    """Counts the ids of each Milvus query the store's client is asked (by wrapping ``client.query``)."""

    def __init__(self, store, monkeypatch, fail=None) -> None:
        self.sizes: list[int] = []
        real = store.client.query

        def query(collection, filter="", **kw):
            n = filter.count('", "') + 1 if " in [" in filter else 0
            self.sizes.append(n)
            if fail is not None:
                fail(n)
            return real(collection, filter=filter, **kw)

        monkeypatch.setattr(store.client, "query", query)


def _want(docs: NewDocs, doc_id: str) -> dict:
    i = docs.ids.index(doc_id)
    want = {"_id": doc_id, "title": docs.titles[i], "text": docs.texts[i]}
    if docs.metadata[i]:
        want["metadata"] = docs.metadata[i]
    return want


def test_documents_of_many_ids_is_one_query_in_the_asked_order(built, monkeypatch):
    root, docs = built
    store = MilvusStore.open(root)
    asked = [docs.ids[i] for i in np.random.default_rng(0).permutation(N)][:500] + ["d0007", "d0003", "d0007"]
    count = Counter(store, monkeypatch)
    got = store.documents(asked)
    assert got == [_want(docs, d) for d in asked]  # order as asked, repeats repeated, metadata only where some
    assert count.sizes == [len(set(asked))]  # one query of the distinct ids: not one per id, not one per 1,024
    assert [store.doc_ids[store.row_of[d]] for d in asked[:5]] == asked[:5]  # each id numbered
    count.sizes.clear()
    assert store.existing(docs.ids + [f"x{i}" for i in range(1_500)]) == set(docs.ids)
    assert count.sizes == [N + 1_500]  # more than the 1,024 ids per query of before


def test_batches_follow_read_batch(built, monkeypatch):
    root, docs = built
    store = MilvusStore.open(root)
    monkeypatch.setattr(milvus_rows, "READ_BATCH", 64)
    count = Counter(store, monkeypatch)
    got = store.documents(docs.ids[:200])
    assert [d["_id"] for d in got] == docs.ids[:200]
    assert count.sizes == [64, 64, 64, 8]


def test_unknown_ids_are_an_error_naming_them_after_one_query(built, monkeypatch):
    root, docs = built
    store = MilvusStore.open(root)
    count = Counter(store, monkeypatch)
    with pytest.raises(UnknownIdError, match=r"2 document id\(s\) not in the index.*'nope', 'd9999'"):
        store.documents(docs.ids[:300] + ["nope", "d9999"])
    assert count.sizes == [302]


def test_other_reads_by_id_are_batched(built, monkeypatch):
    root, docs = built
    store = MilvusStore.open(root)
    ids = docs.ids[100:500]
    count = Counter(store, monkeypatch)
    assert store.existing(ids + ["nope"]) == set(ids)
    assert store.rows(ids) == [store.row_of[d] for d in ids]
    assert store.row_of.known(ids[:50] + ["nope"] + docs.ids[:10]) == set(ids[:50] + docs.ids[:10])
    vecs = store.float_vectors(np.asarray(store.rows(ids[:300])))
    assert np.allclose(vecs, docs.vectors[100:400], atol=1e-6)
    records = read_records(store, ids, vectors=True)
    assert [r["_id"] for r in records] == ids and records[7]["title"] == docs.titles[107]
    assert matching_ids(store, {"even": True}, ids) == [d for d in ids if docs.metadata[docs.ids.index(d)].get("even")]
    # existing, rows, known (the 11 ids not met yet), float_vectors, read_records, matching_ids' filter: one query
    # each; the rows of ids met already (float_vectors', matching_ids' check of the ids) cost none
    assert count.sizes == [401, 400, 11, 300, 400, 400]


def test_a_result_too_large_for_the_server_is_asked_again_in_halves(built, monkeypatch):
    """A Milvus server refuses a query result over ``quotaAndLimits.limits.maxOutputSize`` (100 MB by default)."""
    from pymilvus.exceptions import MilvusException

    root, docs = built
    store = MilvusStore.open(root)

    def refuse(n):
        if n > 150:
            raise MilvusException(message="query results exceed the limit size")

    count = Counter(store, monkeypatch, fail=refuse)
    asked = docs.ids[100:500]
    assert store.documents(asked) == [_want(docs, d) for d in asked]
    assert count.sizes == [400, 200, 100, 100, 200, 100, 100]


def test_other_failures_are_not_retried(built, monkeypatch):
    from pymilvus.exceptions import MilvusException

    root, docs = built
    store = MilvusStore.open(root)

    def refuse(n):
        raise MilvusException(message="rate limit exceeded")

    count = Counter(store, monkeypatch, fail=refuse)
    with pytest.raises(MilvusError, match="reading documents failed: rate limit exceeded"):
        store.documents(docs.ids[100:500])
    assert count.sizes == [400]


def test_removed_documents_are_gone_and_the_rest_read_in_one_query(built, monkeypatch):
    root, docs = built
    store = MilvusStore.open(root).remove(["d0001", "d0002"], show_progress=False)
    count = Counter(store, monkeypatch)
    with pytest.raises(UnknownIdError, match="'d0001', 'd0002'"):
        store.documents(docs.ids[:20])
    assert store.documents(docs.ids[3:20]) == [_want(docs, d) for d in docs.ids[3:20]]
    assert count.sizes == [20, 17]
