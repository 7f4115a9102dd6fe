"""A reader of a Milvus index reads one committed write whole (issue #71.19), however writes interleave with its
queries.

A reader's queries are separate reads (Milvus has no read at a past timestamp): what pins them to one write C is
the write numbers every row carries (``state.visible``) and the state rows of C. A write deleted for good the rows
that the write before it removed, so a reader still on the write before that removal, between two of its queries,
lost the removed documents while its lexicon still counted them: fewer rows than its document count, a removal
seen in part. Now rows (like state rows) stay until a writer whose committed write is two past the reader's
settles, and ``State.intact(C)`` (write C + 2 undecided) tells a reader after its queries that they read C whole.

- The deterministic straddle: a reader opens write C, write C + 1 removes documents, the next write settles, and
  only then does the reader read its rows and lexicon (a step hook between its queries).
- Sampling: three writer threads add, replace and remove (several ids at a time) as fast as they can while a reader
  pinned to one write at a time pauses at random between its queries; every sample that ``intact`` accepts shows
  exactly the ids and texts after one committed write, and its lexicon recounts exactly from its rows.
- Milvus Lite's own flush (xfail): a query that runs while Milvus Lite 3.2.2 flushes a collection reads the rows as
  they were before the unflushed writes, within ONE query: what the issue's sample looked like.
"""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from milvus_writers import FakeMilvus, _Store, _vectors  # noqa: E402

from twotower.retrieval.index.errors import IndexStoreError  # noqa: E402
from twotower.retrieval.index.kinds import IndexSpec  # noqa: E402
from twotower.retrieval.index.newdocs import NewDocs  # noqa: E402
from twotower.retrieval.milvus import state as st  # noqa: E402
from twotower.retrieval.milvus.build import build_version  # noqa: E402
from twotower.retrieval.milvus.state import State, visible  # noqa: E402
from twotower.retrieval.milvus.writes import EMPTY_TERM, query_all, write  # noqa: E402

WORDS = ["tea", "green", "leaf", "cat", "purr", "rust", "memory", "cell", "river", "stone", "cloud", "apple", "okapi",
         "tapir", "kelp", "moss"]


def _text(rng) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(2, 9))))


def _docs(texts: dict[str, str], rng) -> NewDocs:
    return NewDocs(list(texts), [""] * len(texts), list(texts.values()), _vectors(len(texts), rng))


def _read(client, collection: str, head: dict, pause=None) -> tuple[dict[str, str], str | None]:
    """What a reader of ``head`` reads in separate queries (``pause()`` between them): its documents (id -> text)
    and what is wrong with its lexicon against them (None: it recounts exactly: document count, total length,
    every df, the manifest's count)."""
    rows = query_all(client, collection, f"({visible(head)}) and passage == 0", ["id", "text", "sparse", "length"])
    if pause:
        pause()
    lexicon = State(client, "", collection).load_lexicon(head)
    df = np.zeros(len(lexicon.df), dtype=np.int64)
    for r in rows:
        df[[int(j) for j in r["sparse"] if int(j) != EMPTY_TERM]] += 1
    total = sum(int(r["length"]) for r in rows)
    wrong = None
    if lexicon.n_docs != len(rows) or lexicon.total_len != total or not np.array_equal(lexicon.df, df):
        wrong = (f"write {head['seq']}: lexicon n_docs {lexicon.n_docs} total {lexicon.total_len}; rows {len(rows)} "
                 f"total {total}; df differ at terms {np.flatnonzero(lexicon.df != df)[:5].tolist()}")
    elif int(head["manifest"]["num_docs"]) != len(rows):
        wrong = f"write {head['seq']}: the manifest counts {head['manifest']['num_docs']}, rows {len(rows)}"
    shown = {r["id"]: r["text"] for r in rows}
    if len(shown) != len(rows):
        wrong = wrong or f"write {head['seq']}: {len(rows)} rows for {len(shown)} ids"
    return shown, wrong


@pytest.fixture
def fast_leases(monkeypatch):
    monkeypatch.setenv("TWOTOWER_MILVUS_LOCK_SETTLE", "0.001")
    yield
    st.set_step_hook(None)


def test_a_reader_whose_queries_straddle_two_writes_reads_its_write_whole(tmp_path, fast_leases):
    """A reader of write 2 reads its head; write 3 removes three documents;
    write 4 settles (and stops there, in the step hook): only then does the reader read its rows and lexicon. It
    reads write 2 exactly, ``intact`` says so, and once write 4 is decided ``intact`` says the pin may be broken.
    Before the fix the settle of write 4 deleted the three removed rows: the reader saw 9 rows against a lexicon
    of 12 documents."""
    from twotower.retrieval.milvus.client import client_for, forget_client

    uri = str(tmp_path / "snap.db")
    client = client_for(uri, "uri")
    rng = np.random.default_rng(0)
    try:
        texts = {f"d{i}": _text(rng) for i in range(10)}
        build_version(tmp_path / "idx", _docs(texts, rng), model={"name": "random"}, spec=IndexSpec(bm25=True),
                      uri=uri, collection="snap", index={"index_type": "FLAT", "params": {}}, client=client,
                      show_progress=False)
        store = _Store(client, uri, "snap", tmp_path / "idx")
        added = {"n1": _text(rng), "n2": _text(rng)}
        write(store, docs=_docs(added, rng), show_progress=False)  # write 2
        state = State(client, uri, "snap")
        head = state.head()  # the reader pins write 2
        assert head["seq"] == 2
        want = {**texts, **added}
        write(store, remove=["d1", "n1", "n2"], show_progress=False)  # write 3: committed
        seen = {}

        def reader_reads_now(step: str) -> None:  # write 4 has settled what write 3 left, and is not decided
            if step == "recovered" and not seen:
                seen["read"] = _read(client, "snap", head)
                seen["intact"] = state.intact(2)

        st.set_step_hook(reader_reads_now)
        last = {"n3": _text(rng)}
        write(store, docs=_docs(last, rng), show_progress=False)  # write 4
        st.set_step_hook(None)
        shown, wrong = seen["read"]
        assert wrong is None, wrong
        assert shown == want  # write 2 exactly: the documents write 3 removed are still read
        assert seen["intact"] is True
        assert state.intact(2) is False and state.intact(3) is True  # write 4 decided: write 2's pin may break
        after = {d: t for d, t in want.items() if d not in ("d1", "n1", "n2")} | last
        assert _read(client, "snap", state.head()) == (after, None)
    finally:
        forget_client(uri)

