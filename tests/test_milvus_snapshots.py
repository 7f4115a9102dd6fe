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
  exactly the ids and texts after one committed write, and its lexicon recounts exactly from its rows (in memory,
  250 samples, and 2,500 marked slow; on a Milvus Lite server, 200, slow).
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


def _ten_then_two(tmp_path, client, uri: str, collection: str, rng):
    """``(texts, added, store)``: a BM25 index of ten documents d0…d9 built into ``collection`` (write 1), then n1
    and n2 added (write 2)."""
    texts = {f"d{i}": _text(rng) for i in range(10)}
    build_version(tmp_path / "idx", _docs(texts, rng), model={"name": "random"}, spec=IndexSpec(bm25=True),
                  uri=uri, collection=collection, index={"index_type": "FLAT", "params": {}}, client=client,
                  show_progress=False)
    store = _Store(client, uri, collection, tmp_path / "idx")
    added = {"n1": _text(rng), "n2": _text(rng)}
    write(store, docs=_docs(added, rng), show_progress=False)
    return texts, added, store


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
        texts, added, store = _ten_then_two(tmp_path, client, uri, "snap", rng)  # the build, write 2
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



def _sample_while_writing(root, samples: int, seed: int, *, writers: int = 3, most_pause: float = 0.03,
                          limit_s: float = 120.0, client=None, uri: str = "fake") -> dict:
    """``writers`` threads write to one in-memory Milvus (:class:`FakeMilvus`: every call atomic, as one query of a
    strongly consistent Milvus is; or ``client`` at ``uri``) while a reader takes ``samples`` samples, each pinned
    to the committed write it opened, pausing up to ``most_pause`` s between its queries. ``{"errors", "samples",
    "straddled", "broken", "writes"}``: ``straddled`` the samples during which a later write was decided, ``broken``
    the ones ``intact`` refused (or whose state a later write had cleaned: "is gone")."""
    client = client if client is not None else FakeMilvus()
    rng = np.random.default_rng(seed)
    base = {f"o{i}": _text(rng) for i in range(24)}
    build_version(root, _docs(base, rng), model={"name": "random"}, spec=IndexSpec(bm25=True), uri=uri,
                  collection="c", index={"index_type": "FLAT", "params": {}}, client=client, show_progress=False)
    store = _Store(client, uri, "c", root)
    changes: dict[int, dict[str, str | None]] = {1: dict(base)}  # write number -> what it changed (None: removed)
    errors: list[str] = []
    done = threading.Event()
    changes_lock = threading.Lock()

    def writer(w: int) -> None:
        r = np.random.default_rng([seed, w])
        originals = [d for i, d in enumerate(base) if i % writers == w]
        mine: dict[str, str] = {}  # the documents this writer added, alive
        k = 0
        while not done.is_set():
            k += 1
            if k % 3 == 1 or not mine:
                op = {f"w{w}k{k}x{j}": _text(r) for j in range(3)}
                kwargs = {"docs": _docs(op, r)}
            elif k % 3 == 2:
                d = min(mine)
                op = {d: _text(r) + " again"}
                kwargs = {"docs": _docs(op, r), "replace": True}
            else:  # several ids at once: one original (while any is left) and every document it added
                gone = [*originals[:1], *sorted(mine)]
                originals[:1] = []
                op = dict.fromkeys(gone)
                kwargs = {"remove": gone}
            while True:
                try:
                    head = write(store, show_progress=False, **kwargs)
                    break
                except IndexStoreError as exc:  # two writers past the lease at once: the loser wrote nothing
                    if "nothing of this write is visible" not in str(exc):
                        errors.append(f"writer {w}: {exc}")
                        return
            with changes_lock:
                changes[int(head["seq"])] = op
            for d, t in op.items():
                if t is None:
                    mine.pop(d, None)
                else:
                    mine[d] = t

    taken: list[tuple[int, dict, str | None]] = []
    counts = {"straddled": 0, "broken": 0}
    state = State(client, uri, "c")
    pr = random.Random(seed)

    def pause() -> None:  # a reader that stalls now and then (a GC pause, a SIGSTOP) between its queries
        if pr.random() < 0.4:
            time.sleep(pr.uniform(0, most_pause))

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + limit_s
    try:
        while len(taken) < samples and time.monotonic() < deadline and not errors:
            head = state.head()
            seq = int(head["seq"])
            pause()
            try:
                shown, wrong = _read(client, "c", head, pause)
            except IndexStoreError as exc:  # its lexicon cleaned by a later write: a broken pin, said so
                assert "is gone" in str(exc), exc
                counts["broken"] += 1
                continue
            if not state.intact(seq):
                counts["broken"] += 1
                continue
            counts["straddled"] += state.decided(seq + 1) is not None
            taken.append((seq, shown, wrong))
    finally:
        done.set()
        for t in threads:
            t.join(60)
    for seq, shown, wrong in taken:  # each sample against the state after exactly its committed write
        want: dict[str, str | None] = {}
        for n in range(1, seq + 1):
            want.update(changes.get(n) or {f"write {n} unknown": "no writer returned it"})
        want = {d: t for d, t in want.items() if t is not None}
        if wrong or shown != want:
            missing, extra = sorted(set(want) - set(shown)), sorted(set(shown) - set(want))
            errors.append(wrong or f"write {seq}: shows {len(shown)} documents, not its {len(want)}: missing "
                                   f"{missing[:6]}, extra {extra[:6]}, other texts "
                                   f"{sorted(d for d in set(want) & set(shown) if want[d] != shown[d])[:6]}")
    return {"errors": errors, "samples": len(taken), "writes": max(changes) - 1, **counts}


def _check(result: dict, samples: int) -> None:
    bad = result["errors"]
    assert not bad, f"{len(bad)} of {result['samples']} samples wrong, e.g. {bad[:3]}"
    assert result["samples"] >= samples, result
    # the samples did straddle commits: a later write decided while they read, and they read their own whole
    assert result["straddled"] >= samples // 10, result


def test_a_sampled_reader_reads_whole_writes_while_three_threads_write(tmp_path, fast_leases):
    result = _sample_while_writing(tmp_path, 250, seed=1)  # ~15 s; 5 % of such samples were wrong before the fix
    _check(result, 250)


@pytest.mark.slow  # ~2.5 minutes on 2 shared cores: 2,500 samples (TWOTOWER_STRESS_SAMPLES for more)
def test_thousands_of_samples_read_whole_writes_while_three_threads_write(tmp_path, fast_leases):
    samples = int(os.environ.get("TWOTOWER_STRESS_SAMPLES", "2500"))
    result = _sample_while_writing(tmp_path, samples, seed=2, limit_s=600)
    _check(result, samples)


@pytest.mark.slow  # ~45 s on 2 shared cores: a Milvus Lite server, 200 samples
def test_samples_on_a_milvus_lite_server_read_whole_writes(tmp_path, monkeypatch):
    """The same on Milvus Lite's server (no flush comes: far below its memtable's size); 6 of 150 samples were
    wrong there before the fix."""
    from milvus_server import lite_server

    from twotower.retrieval.milvus.client import connect

    monkeypatch.setenv("TWOTOWER_MILVUS_LOCK_SETTLE", "0.02")
    try:
        with lite_server(tmp_path / "data") as uri:
            result = _sample_while_writing(tmp_path / "idx", 200, seed=3, most_pause=0.3, client=connect(uri),
                                           uri=uri, limit_s=400)
            _check(result, 200)
    finally:
        st.set_step_hook(None)


@pytest.mark.xfail(strict=True, reason=(
    "Milvus Lite 3.2.2 (embedded and server mode): its flush swaps the collection's memtable for an empty one "
    "before the flushed rows and tombstones reach its segments (engine/collection.py _trigger_flush: step 1 outside "
    "the maintenance lock), so ONE query that runs meanwhile reads the rows as the last flush left them: rows "
    "written since are missing, rows removed or re-marked since come back. No read of twotower's can fence that: "
    "each query is wrong on its own. twotower never flushes Milvus Lite in a write, but Lite flushes by itself at "
    "128 MiB of memtable or 256 MiB of log; a Milvus server has no such window"))
def test_a_query_during_a_milvus_lite_flush_reads_its_write_whole(tmp_path, monkeypatch, fast_leases):
    """The issue's sample (#71.19: an original document still visible, the new ids of the same remove hidden, the
    lexicon counting one document fewer than the rows), made deterministic: the build flushed d0…d9 into a segment;
    write 2 adds n1, n2; write 3 removes d1, n1 and n2 (marks in the memtable); a reader of write 3 queries while
    Milvus Lite flushes."""
    import milvus_lite.engine.collection as lite

    from twotower.retrieval.milvus.client import client_for, forget_client

    if not hasattr(lite, "WAL") or not hasattr(lite.Collection, "_trigger_flush"):
        pytest.skip("not Milvus Lite 3.2's engine")
    uri = str(tmp_path / "flush.db")
    client = client_for(uri, "uri")
    rng = np.random.default_rng(0)
    try:
        texts, added, store = _ten_then_two(tmp_path, client, uri, "flushing", rng)
        write(store, remove=["d1", "n1", "n2"], show_progress=False)
        head = State(client, uri, "flushing").head()
        want = {d: t for d, t in texts.items() if d != "d1"}
        assert _read(client, "flushing", head) == (want, None)  # whole, outside a flush
        seen = {}
        real = lite.WAL

        def wal(*args, **kwargs):  # _trigger_flush's step 1: the memtable just swapped, the flush not yet done
            if "read" not in seen:
                seen["read"] = _read(client, "flushing", head)
            return real(*args, **kwargs)

        monkeypatch.setattr(lite, "WAL", wal)
        client.flush("flushing")  # what Milvus Lite does by itself once its memtable or log is full
        monkeypatch.setattr(lite, "WAL", real)
        shown, wrong = seen["read"]
        assert _read(client, "flushing", head) == (want, None)  # whole again after the flush
        assert wrong is None and shown == want, (wrong, sorted(set(shown) ^ set(want)))
    finally:
        forget_client(uri)
