"""Readers racing writers from another process (issue #71 item 8): a reader sees one whole version, always.

Metadata-only writes (``index.relabel``) are fast enough that ``keep=2`` older versions were collected while a reader
had a version open and had not yet read its lazily loaded parts (``faiss.index``, ``bm25/``, ``docs.jsonl`` for filter
columns): a raw FAISS ``RuntimeError: could not open …/faiss.index`` in Python, a 500 (``FileNotFoundError`` on
``bm25/params.index.json``) from the service. Readers now hold their version (``index.versions.Lease``: a shared
``flock`` on ``INDEX/.readers/vNNNNNN``) and writers collect only versions nobody holds.

Each write below is made by another process (a writer subprocess driven over a pipe) and gives every document the
metadata ``{"gen": N}`` of the version ``vN`` it creates (the build's documents have ``gen`` 1, ``v000001``), so a read
is of one whole version exactly when every document it returns says the ``gen`` of the version it read. Rankings are
checked against the ones computed before any write (metadata writes change no vector, text or BM25 statistic).

- the window forced deterministically at each step of opening: after ``CURRENT`` is read, before and after the
  reader's lock, after the version is open and before its lazily loaded parts are read — with 1 to 4 writes (default
  ``keep=2`` and ``keep=0``) made there by the writer process; through ``IndexStore``, ``tt.Index`` (search in every
  mode, filters, ``$text``, get, list, count) and the HTTP service;
- the lock protocol itself, on stand-in versions, under 2,000 seeded random interleavings of reader steps and writes
  (and a writer stopped between its exclusive lock and the rename, with a reader waiting on it);
- versions still collected once released (also for a dropped ``tt.Index`` whose ``$text`` filter columns referred
  back to its store), and stale lock files swept;
- a bounded stress run: a writer process looping metadata updates while this process reads a few thousand times.
"""

from __future__ import annotations

import gc
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import twotower as tt
from _fixtures import build_small_index, private_copy
from twotower.retrieval.index import versions as versions_mod
from twotower.retrieval.store import IndexStore

N_DOCS = 24
QUERY = "green tea leaf"
WORDS = "tea green leaf cup water hot cold brew steam roast bean milk sugar sweet bitter".split()

_WRITER = r"""
import json, sys, time
from twotower.retrieval.manage import update
from twotower.retrieval.store import IndexStore

def write(store, keep):
    store = store.refresh()
    gen = int(store.version[1:]) + 1  # a metadata write makes exactly the next version
    store, _ = update(store, lambda _id, old: {**old, "gen": gen}, keep=keep, every=True)
    assert store.version == f"v{gen:06d}", (store.version, gen)
    return store

print("ready", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    store = IndexStore.open(cmd["root"])
    done = 0
    if "seconds" in cmd:
        t0 = time.monotonic()
        while time.monotonic() - t0 < cmd["seconds"]:
            store = write(store, cmd["keep"])
            done += 1
    else:
        for _ in range(cmd["n"]):
            store = write(store, cmd["keep"])
            done += 1
    version = store.version
    store.close()
    del store
    print(json.dumps({"version": version, "writes": done}), flush=True)
"""


class Writer:
    """Another process making metadata writes on request (each one version, ``gen`` = its number)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline().strip() == "ready", self.proc.stderr.read()

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"writer process failed:\n{self.proc.stderr.read()}")
        return json.loads(line)

    def write(self, root: Path, n: int, keep: int = 2) -> str:
        self.send({"root": str(root), "n": n, "keep": keep})
        return self.reply()["version"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _corpus() -> list[dict]:
    rng = np.random.default_rng(7)
    return [{"_id": f"d{i:02d}", "title": "", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(3, 8)))) + ".",
             "gen": 1, "i": i} for i in range(N_DOCS)]


@pytest.fixture(scope="module")
def built(tiny_bert_dir, tmp_path_factory):
    return build_small_index(tmp_path_factory.mktemp("readers") / "index", _corpus(), tiny_bert_dir)


@pytest.fixture()
def root(built, tmp_path):
    return private_copy(built, tmp_path)


@pytest.fixture(scope="module")
def writer():
    w = Writer()
    yield w
    w.close()


@pytest.fixture(scope="module")
def reference(built):
    """Rankings before any write: ``{mode: [(id, score), ...]}`` (metadata writes change none of them)."""
    index = tt.Index.open(built)
    out = {mode: [(h.id, h.score) for h in index.search(QUERY, k=5, mode=mode)] for mode in ("dense", "bm25", "hybrid")}
    out["vector"] = np.random.default_rng(3).standard_normal(index.store.dim).astype(np.float32)  # no encoding
    out["dense vector"] = [(h.id, h.score) for h in index.search(query_vector=out["vector"], k=5)]
    out["hybrid vector"] = [(h.id, h.score) for h in index.search(QUERY, query_vector=out["vector"], k=5,
                                                                   mode="hybrid")]
    out["text"] = sorted(d["_id"] for d in _corpus() if "tea" in d["text"])
    assert out["text"] and len(out["text"]) < N_DOCS
    return out


def _number(version: str) -> int:
    return int(version[1:])


def _gens(docs) -> set:
    return {d.metadata["gen"] for d in docs}


def _ranked(hits, reference, mode) -> None:
    assert [h.id for h in hits] == [d for d, _ in reference[mode]], mode
    np.testing.assert_allclose([h.score for h in hits], [s for _, s in reference[mode]], rtol=1e-5, atol=1e-6)


# each: (name, read through a tt.Index, check of its result given the reference and the gen it must show)
def _check_search(mode):
    def check(result, ref, gen):
        _ranked(result, ref, mode)
        assert _gens(result) == {gen}
    return check


def _check_docs(result, ref, gen):
    assert len(result) == N_DOCS and _gens(result) == {gen}


def _check_text(result, ref, gen):
    assert sorted(d.id for d in result) == ref["text"] and _gens(result) == {gen}


def _check_list(result, ref, gen):
    assert result.ids == sorted(d["_id"] for d in _corpus()) and result.next is None and result.total == N_DOCS
    assert _gens(result.documents) == {gen}


def _check_filtered(result, ref, gen):
    assert len(result) == 5 and _gens(result) == {gen}


def _check_count(result, ref, gen):
    assert result == N_DOCS


OPS = {
    "dense vector": (lambda ix, ref: ix.search(query_vector=ref["vector"], k=5), _check_search("dense vector")),
    "hybrid vector": (lambda ix, ref: ix.search(QUERY, query_vector=ref["vector"], k=5, mode="hybrid"),
                      _check_search("hybrid vector")),
    **{name: (lambda ix, ref, read=read: read(ix), check) for name, (read, check) in {}.items()},
}
OPS = {
    "dense": (lambda ix: ix.search(QUERY, k=5, mode="dense"), _check_search("dense")),
    "bm25": (lambda ix: ix.search(QUERY, k=5, mode="bm25"), _check_search("bm25")),
    "hybrid": (lambda ix: ix.search(QUERY, k=5, mode="hybrid"), _check_search("hybrid")),
    "filtered": (lambda ix: ix.search(QUERY, k=5, mode="dense", filter={"i": {"$gte": 0}}), _check_filtered),
    "text": (lambda ix: ix.get(filter={"$text": {"$contains": "tea"}}), _check_text),
    "get": (lambda ix: ix.get(filter={"i": {"$gte": 0}}), _check_docs),
    "list": (lambda ix: ix.list(limit=N_DOCS), _check_list),
    "count": (lambda ix: ix.count({"i": {"$gte": 0}}), _check_count),
}


@pytest.fixture()
def after_open(monkeypatch):
    """``arm(action)``: run ``action`` once, right after the next :class:`IndexStore` is opened (its lazily loaded
    parts not yet read); returns a list that gets the version that store opened."""
    original = IndexStore.__init__

    def arm(action):
        opened: list[str] = []

        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if not opened:
                opened.append(self.version)
                action()

        monkeypatch.setattr(IndexStore, "__init__", init)
        return opened

    return arm


# ---- the window between opening a version and reading its lazy parts ----------------------------------------------

@pytest.mark.parametrize("keep,writes", [(2, 3), (2, 4), (0, 1), (0, 2)])
@pytest.mark.parametrize("op", list(OPS))
def test_index_reads_one_whole_version_when_writes_collect_it_before_its_lazy_parts(root, writer, reference,
                                                                                     after_open, op, keep, writes):
    """``tt.Index``: each call opens the live version (refresh); the writer process then makes enough writes to
    collect it (keep=2: 3; keep=0: 1) before the call reads ``faiss.index``, ``bm25/`` or the filter columns."""
    read, check = OPS[op]
    index = tt.Index.open(root)
    writer.write(root, 1)  # so that the call below opens a new version (and the hook fires there)
    opened = after_open(lambda: writer.write(root, writes, keep))
    result = read(index)
    assert opened, "the call opened no version"
    check(result, reference, _number(opened[0]))
    assert _number(index.info()["live_version"]) == _number(opened[0]) + writes
    del index, result


@pytest.mark.parametrize("keep,writes", [(2, 3), (0, 1)])
def test_an_open_store_reads_its_lazy_parts_from_its_own_version(root, writer, reference, keep, writes):
    """``IndexStore`` directly: FAISS, BM25, filter columns and documents all from the version it opened, however
    many writes came after (FAISS raised 'could not open …/faiss.index' once the version was collected)."""
    from twotower.retrieval.filters.columns import columns_of
    from twotower.retrieval.filters import parse_filter

    store = IndexStore.open(root)
    writer.write(root, writes + 2, keep)  # far past keep
    gen = _number(store.version)
    q = np.asarray(store.float_vectors([3]), dtype=np.float32)
    _, rows = store.search(q, k=3)
    assert rows[0, 0] == 3
    assert store.bm25 is not None
    mask = parse_filter({"$text": {"$contains": "tea"}}).mask(columns_of(store))
    assert sorted(store.doc_ids[r] for r in np.flatnonzero(mask)) == reference["text"]
    assert {store.metadata(r)["gen"] for r in range(len(store))} == {gen}
    assert (root / "versions" / store.version).is_dir()  # held
    old = store.version
    store.close()
    writer.write(root, 1, keep)
    assert not (root / "versions" / old).exists()  # released: the next write collects it
    # the current version and the keep before it, and with keep=0 the one the writer itself held while writing
    assert len([p for p in (root / "versions").iterdir() if not p.name.startswith(".")]) == max(keep, 1) + 1


def test_service_reads_one_whole_version_when_writes_collect_it(root, writer, reference, after_open):
    """``twotower serve``: the request's snapshot opens the live version; 3 writes collect it before the search
    loads BM25 and FAISS (3 of 1,443 searches answered 500 on bm25/params.index.json)."""
    from conftest import serve_client

    client = serve_client(root, None)
    for path, body in (("/search", {"query": QUERY, "k": 5, "mode": "hybrid"}),
                       ("/search", {"query": QUERY, "k": 5, "mode": "bm25", "filter": {"i": {"$gte": 0}}}),
                       ("/list", {"filter": {"$text": {"$contains": "tea"}}, "limit": 50}),
                       ("/count", {"filter": {"i": {"$gte": 0}}})):
        writer.write(root, 1)
        opened = after_open(lambda: writer.write(root, 3))
        res = client.post(path, json=body)
        assert res.status_code == 200, res.text
        assert opened and res.json()["version"] == opened[0]
        body_json = res.json()
        if path == "/search":
            hits = body_json["results"][0]["hits"] if "results" in body_json else body_json["hits"]
            assert len(hits) == 5 and {h["metadata"]["gen"] for h in hits} == {_number(opened[0])}
        elif path == "/list":
            assert body_json["ids"] == reference["text"]
            assert {d["metadata"]["gen"] for d in body_json["documents"]} == {_number(opened[0])}
        else:
            assert body_json["count"] == N_DOCS


# ---- the window while opening: each step of the lock protocol -----------------------------------------------------

class _FlockSpy:
    """``fcntl`` for :mod:`twotower.retrieval.index.versions` that runs ``before`` / ``after`` around a reader's
    shared lock (once each)."""

    def __init__(self, real, before=None, after=None) -> None:
        self._real, self.before, self.after = real, before, after

    def __getattr__(self, name):
        return getattr(self._real, name)

    def flock(self, fd, op):
        shared = op == self._real.LOCK_SH
        if shared and self.before:
            action, self.before = self.before, None
            action()
        self._real.flock(fd, op)
        if shared and self.after:
            action, self.after = self.after, None
            action()


@pytest.mark.parametrize("writes", [1, 3, 4])
@pytest.mark.parametrize("point", ["after CURRENT", "before lock", "after lock"])
def test_opening_retries_or_holds_at_each_step(root, writer, monkeypatch, point, writes):
    """Writes by another process at each step of opening (keep=2): the version read in ``CURRENT`` collected before
    the reader's lock is granted makes the reader open the new ``CURRENT`` whole; once its lock is granted, the
    version stays (the writes skip it) until the reader lets it go."""
    import fcntl

    before = versions_mod.current_version(root)
    def action():
        writer.write(root, writes)

    if point == "after CURRENT":
        real = versions_mod.read_manifest
        fired: list = []

        def read_manifest(path):
            manifest = real(path)
            if not fired:
                fired.append(path)
                action()
            return manifest

        monkeypatch.setattr(versions_mod, "read_manifest", read_manifest)
    else:
        spy = _FlockSpy(fcntl, **({"before": action} if point == "before lock" else {"after": action}))
        monkeypatch.setattr(versions_mod, "fcntl", spy)
    store = IndexStore.open(root)
    live = versions_mod.current_version(root)
    assert _number(live) == _number(before) + writes
    collected = writes >= 3  # keep=2: the 3rd write collects the version read first unless it is held
    if point == "after lock" or not collected:
        assert store.version == before  # held (after lock) or never collected
    else:
        assert store.version == live  # retried at the new CURRENT
    assert {store.metadata(r)["gen"] for r in range(len(store))} == {_number(store.version)}
    store.search(np.asarray(store.float_vectors([0])), k=1)
    assert store.bm25 is not None
    monkeypatch.undo()
    name = store.version
    store.close()
    writer.write(root, 3)
    assert not (root / "versions" / name).exists()


# ---- the protocol under many interleavings (stand-in versions, in this process) -----------------------------------

@pytest.fixture()
def fast_dir(tmp_path):
    """A folder in memory where there is one (thousands of small writes: ~60x faster than this disk), else tmp_path."""
    import tempfile

    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="tt-readers-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fake_index(root: Path) -> None:
    (root / "versions" / "v000001").mkdir(parents=True)
    (root / "versions" / "v000001" / "data").write_text("v000001")
    (root / "CURRENT").write_text("v000001\n")


def _fake_write(root: Path, keep: int) -> str:
    """What a write does to the folder: publish the next version (whole), point CURRENT at it, collect."""
    n = _number(versions_mod.current_version(root)) + 1
    name = f"v{n:06d}"
    tmp = versions_mod.new_temp_dir(root)
    (tmp / "data").write_text(name)
    os.rename(tmp, root / "versions" / name)
    (root / "CURRENT").write_text(name + "\n")
    versions_mod.collect_garbage(root / "versions", name, keep)
    return name


def test_lock_protocol_under_random_interleavings(fast_dir, monkeypatch):
    """2,000 seeded schedules: 0-3 writes (keep 0-2) before the reader reads CURRENT, between that and its lock,
    right after its lock, and while it holds; the reader opens through ``open_live`` + ``hold`` as the store does.
    Invariants: what the reader holds is whole (its data names it) until it lets go; every version nobody holds
    beyond ``keep`` is collected; no lock file outlives its version."""
    import fcntl

    rng = random.Random(71)
    root = fast_dir / "fake"
    _fake_index(root)
    held: list = []  # (lease, name) the reader still holds
    retried = kept = 0
    for _ in range(int(os.environ.get("TT_SCHEDULES", "2000"))):
        keep = rng.randint(0, 2)
        plan = {point: rng.randint(0, 3) for point in ("start", "after CURRENT", "before lock", "after lock", "held")}

        def writes(point, plan=plan, keep=keep):
            for _ in range(plan[point]):
                _fake_write(root, keep)

        writes("start")
        first_read: list = []

        def opened(version_dir, manifest, first_read=first_read, writes=writes):
            first_read.append(version_dir.name)
            if len(first_read) == 1:
                writes("after CURRENT")
            lease = versions_mod.hold(root, version_dir.name)
            assert (version_dir / "data").read_text() == version_dir.name
            return lease, version_dir.name

        spy = _FlockSpy(fcntl, before=lambda w=writes: w("before lock"), after=lambda w=writes: w("after lock"))
        monkeypatch.setattr(versions_mod, "fcntl", spy)
        monkeypatch.setattr(versions_mod, "read_manifest", lambda path: {})
        lease, name = versions_mod.open_live(root, opened)
        monkeypatch.undo()
        retried += len(first_read) > 1
        held.append((lease, name))
        writes("held")
        for lease_, name_ in held:  # whatever the reader holds is whole
            assert (root / "versions" / name_ / "data").read_text() == name_
        kept += any(_number(n) < _number(versions_mod.current_version(root)) - keep for _, n in held)
        while held and rng.random() < 0.6:  # let some go
            lease_, _ = held.pop(rng.randrange(len(held)))
            lease_.close()
        live = _number(versions_mod.current_version(root))
        names = {n for _, n in held}
        _fake_write(root, keep)  # collects everything let go
        live += 1
        on_disk = {p.name for p in (root / "versions").iterdir()}
        assert not {p for p in on_disk if p.startswith(".")}, on_disk
        allowed = {f"v{n:06d}" for n in range(live - keep, live + 1)} | names
        assert on_disk <= allowed and {f"v{n:06d}" for n in range(max(1, live - keep), live + 1)} <= on_disk
        assert {p.name for p in (root / versions_mod.READERS).iterdir()} <= on_disk
    assert retried > 100 and kept > 100  # both sides of the protocol were exercised


def test_reader_waits_for_a_writer_midway_and_then_opens_the_new_version(tmp_path, monkeypatch):
    """A writer stopped between taking a version's lock exclusively and renaming it away: a reader of that version
    waits on its lock, then finds it gone and opens the new CURRENT."""
    import fcntl

    root = tmp_path / "fake"
    _fake_index(root)
    lease = versions_mod.hold(root, "v000001")  # keeps v000001 through the first write
    _fake_write(root, 0)
    lease.close()
    (root / "CURRENT").write_text("v000001\n")  # a reader that read CURRENT before the next write switched it...
    (root / "versions" / "v000003").mkdir()
    (root / "versions" / "v000003" / "data").write_text("v000003")
    stop, go = threading.Event(), threading.Event()

    class Paused(_FlockSpy):
        def flock(self, fd, op):
            self._real.flock(fd, op)
            if op == self._real.LOCK_EX | self._real.LOCK_NB:
                stop.set()
                assert go.wait(30)

    monkeypatch.setattr(versions_mod, "fcntl", Paused(fcntl))
    w = threading.Thread(target=versions_mod.collect_garbage, args=(root / "versions", "v000003", 0))
    w.start()
    assert stop.wait(30)  # the writer holds v000001's lock exclusively
    monkeypatch.setattr(versions_mod, "fcntl", fcntl)
    got: list = []

    def reader():
        try:
            versions_mod.hold(root, "v000001")
        except FileNotFoundError as exc:
            got.append(exc)

    r = threading.Thread(target=reader)
    r.start()
    r.join(0.3)
    assert r.is_alive()  # waiting for the writer
    (root / "CURRENT").write_text("v000003\n")
    go.set()
    w.join(30)
    r.join(30)
    assert got and not (root / "versions" / "v000001").exists()
    lease = versions_mod.hold(root, versions_mod.current_version(root))
    assert lease.held
    lease.close()


def test_stale_lock_files_are_swept_and_a_read_only_reader_still_opens(tmp_path):
    root = tmp_path / "fake"
    _fake_index(root)
    (root / versions_mod.READERS).mkdir()
    (root / versions_mod.READERS / "v000000").touch()  # left by a reader that came too late
    _fake_write(root, 2)
    assert sorted(p.name for p in (root / versions_mod.READERS).iterdir()) == []
    with pytest.raises(FileNotFoundError):
        versions_mod.hold(root, "v000000")


def test_a_dropped_index_lets_its_version_go(root, writer):
    """The store a ``tt.Index`` drops (``$text`` filter columns included: they referred back to the store, a cycle
    that kept the version held until Python's cycle collector ran) no longer holds its version."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        index = tt.Index.open(root)
        assert index.get(filter={"$text": {"$contains": "tea"}})
        old = index.info()["live_version"]
        del index
        writer.write(root, 3)
        assert not (root / "versions" / old).exists()
    finally:
        if enabled:
            gc.enable()


# ---- stress: a writer process looping, this process reading --------------------------------------------------------

def test_stress_reads_during_a_writer_loop(root, reference):
    """A writer process loops metadata updates (default keep=2, then keep=0) for a few seconds; this process reads
    through ``tt.Index`` (search in each mode — dense by a given query vector, so no query is encoded —, filters,
    ``$text``, get, list, count) and ``IndexStore`` (open, then its lazy parts) meanwhile: no exception, every read
    of one whole version and ranked as before any write."""
    vector = reference["vector"]
    ops = {
        "dense": (lambda ix: ix.search(query_vector=vector, k=5), _check_search("dense vector")),
        "hybrid": (lambda ix: ix.search(QUERY, query_vector=vector, k=5, mode="hybrid"),
                   _check_search("hybrid vector")),
        "filtered": (lambda ix: ix.search(query_vector=vector, k=5, filter={"i": {"$gte": 0}}), _check_filtered),
        **{name: OPS[name] for name in ("bm25", "text", "get", "list", "count")},
    }
    names = [*ops, "store"]
    budget = 8.0  # seconds of writes, half with each keep
    reads = 0
    failures: list = []
    for keep in (2, 0):
        w = Writer()
        try:
            w.send({"root": str(root), "seconds": budget / 2, "keep": keep})
            done = threading.Event()
            result: dict = {}

            def wait(w=w, done=done, result=result):
                try:
                    result.update(w.reply())
                finally:  # a writer that died ends the reads too (its reply raised): never loop for ever
                    done.set()

            threading.Thread(target=wait, daemon=True).start()
            index = tt.Index.open(root)
            deadline = time.monotonic() + budget / 2 + 120
            while not done.is_set() and time.monotonic() < deadline:
                op = names[reads % len(names)]
                reads += 1
                try:
                    if op == "store":  # IndexStore: open, then the lazy parts
                        store = IndexStore.open(root)
                        gen = _number(store.version)
                        _, rows = store.search(np.asarray(store.float_vectors([5])), k=1)
                        assert rows[0, 0] == 5
                        assert store.bm25 is not None
                        assert {store.metadata(r)["gen"] for r in range(len(store))} == {gen}
                        store.close()
                        continue
                    read, check = ops[op]
                    got = read(index)
                    docs = got.documents if op == "list" else got if isinstance(got, list) else None
                    gens = _gens(docs) if docs is not None else {None}
                    assert len(gens) == 1, gens  # one version's metadata
                    check(got, reference, next(iter(gens)))
                except Exception as exc:  # noqa: BLE001 - collected and reported below
                    failures.append(f"{op}: {type(exc).__name__}: {exc}")
            assert done.wait(60)
            assert result["writes"] > 5, result
            print(f"keep={keep}: {result['writes']} writes, {reads} reads so far")
            del index
        finally:
            w.close()
    assert not failures, f"{len(failures)} of {reads} reads failed: {failures[:5]}"
    assert reads > 300  # thousands on an idle machine; a few hundred with both cores busy


def test_a_lease_dropped_at_interpreter_exit_says_nothing(tmp_path):
    """An index still open when the interpreter exits: its lease is collected after this module's globals are gone
    (``contextlib`` None), which printed "Exception ignored in: Lease.__del__ … AttributeError" at every exit."""
    from conftest import subprocess_env

    script = ("import sys\nimport numpy as np\nimport twotower as tt\n"
              "ix = tt.Index.build(sys.argv[1], ['one', 'two', 'three'], vectors=np.eye(3, dtype=np.float32), "
              "show_progress=False)\n"
              "ix.update([ix.added_ids[0]], metadata={'a': 1})\n"
              "print(len(tt.Index.open(sys.argv[1]).search(query_vector=[1, 0, 0], k=2)))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ix")], capture_output=True, text=True,
                          timeout=120, env=subprocess_env())
    assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
