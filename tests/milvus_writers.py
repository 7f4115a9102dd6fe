"""Concurrent writers on one Milvus index with random pauses at every step (issue #54): the harness of
``test_milvus_concurrency.py``, on Milvus Lite's server or on :class:`FakeMilvus`, an in-memory stand-in whose every
call is atomic (as a strongly consistent Milvus's are) so that thousands of schedules run in minutes.

A schedule: an index of 12 documents, 2 or 3 writers each doing 3 writes (an add of 3 new documents, a replace of
one of its own, a remove of one of the originals it owns, in a random order of kinds), every step of every write
(:func:`twotower.retrieval.milvus.state.crash_point`) pausing with probability ``p`` for up to ``pauses`` lease
lengths, and a reader sampling the committed state all along. Checked: every write is all or nothing in every sample
and at the end; a write that failed ("another writer took over") is visible nowhere; every write that succeeded is
visible at the end; the BM25 statistics of every committed write (document count, total length, every df) equal a
recount over the rows it shows.
"""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import numpy as np

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.index.kinds import IndexSpec
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.milvus import state as st
from twotower.retrieval.milvus.build import build_version
from twotower.retrieval.milvus.lease import TakenOver
from twotower.retrieval.milvus.state import State, visible
from twotower.retrieval.milvus.writes import EMPTY_TERM, query_all, write

WORDS = ["tea", "green", "leaf", "cat", "purr", "rust", "memory", "cell", "river", "stone", "cloud", "apple"]


class FakeMilvus:
    """The few MilvusClient calls twotower's writes make, on dicts under one lock (filters evaluated as Python)."""

    def __init__(self) -> None:
        self.collections: dict[str, dict] = {}
        self.primary: dict[str, str] = {}
        self.lock = threading.Lock()
        self._code: dict[str, object] = {}

    class _Schema:
        def __init__(self):
            self.primary = None

        def add_field(self, name, *_, is_primary=False, **__):
            if is_primary:
                self.primary = name

    class _Params:
        def add_index(self, *_, **__):
            pass

    def create_schema(self, **_):
        return self._Schema()

    def prepare_index_params(self):
        return self._Params()

    def create_collection(self, name, schema=None, **_):
        with self.lock:
            self.collections[name], self.primary[name] = {}, schema.primary

    def has_collection(self, name):
        return name in self.collections

    def drop_collection(self, name):
        with self.lock:
            self.collections.pop(name, None)

    def load_collection(self, name):
        pass

    def flush(self, name):
        pass

    def _match(self, expr: str):
        if not expr:
            return lambda row: True
        code = self._code.get(expr)
        if code is None:
            py = re.sub(r'(\w+) like ("(?:[^"\\]|\\.)*")', r"_like(\1, \2)", expr)
            code = self._code[expr] = compile(py, "<filter>", "eval")
        return lambda row: eval(code, {"_like": lambda v, p: v.startswith(p.rstrip("%"))}, row)  # noqa: S307

    def upsert(self, name, rows):
        with self.lock:
            coll, pk = self.collections[name], self.primary[name]
            for r in rows:
                coll[r[pk]] = dict(r)

    insert = upsert  # every key the writes insert is new

    def delete(self, name, filter=""):  # noqa: A002
        with self.lock:
            coll, match = self.collections[name], self._match(filter)
            for key in [k for k, r in coll.items() if match(r)]:
                del coll[key]

    def query(self, name, filter="", output_fields=None, **_):  # noqa: A002
        with self.lock:
            match = self._match(filter)
            found = [dict(r) for r in self.collections[name].values() if match(r)]
        if output_fields == ["count(*)"]:
            return [{"count(*)": len(found)}]
        return [{f: r.get(f) for f in output_fields} for r in found] if output_fields else found

    def query_iterator(self, name, batch_size=1000, filter="", output_fields=None):  # noqa: A002
        rows = self.query(name, filter=filter, output_fields=output_fields)

        class _It:
            def next(self):
                nonlocal rows
                out, rows = rows[:batch_size], rows[batch_size:]
                return out

            def close(self):
                pass
        return _It()


class _Store:
    """What :func:`twotower.retrieval.milvus.writes.write` needs of a store."""

    def __init__(self, client, uri: str, collection: str, root: Path) -> None:
        self.client, self.uri, self.collection, self.root = client, uri, collection, root


def _vectors(n: int, rng) -> np.ndarray:
    v = rng.standard_normal((n, 8)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _text(rng) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(int(rng.integers(2, 9))))


def build(client, uri: str, collection: str, root: Path, rng) -> dict[str, str]:
    """An index of 12 documents (``o0`` … ``o11``); their texts."""
    texts = {f"o{i}": _text(rng) for i in range(12)}
    docs = NewDocs(list(texts), [""] * 12, list(texts.values()), _vectors(12, rng))
    build_version(root, docs, model={"name": "random"}, spec=IndexSpec(bm25=True), uri=uri, collection=collection,
                  index={"index_type": "FLAT", "params": {}}, client=client, show_progress=False)
    return texts


def recount(client, collection: str, head: dict) -> tuple[list[dict], str | None]:
    """The rows ``head`` shows, and what is wrong with its BM25 statistics (None: they recount exactly)."""
    rows = query_all(client, collection, visible(head), ["id", "text", "sparse", "length"])
    lexicon = State(client, "", collection).load_lexicon(head)
    df = np.zeros(len(lexicon.df), dtype=np.int64)
    for r in rows:
        df[[int(j) for j in r["sparse"] if int(j) != EMPTY_TERM]] += 1
    total = sum(int(r["length"]) for r in rows)
    if lexicon.n_docs != len(rows) or lexicon.total_len != total or not np.array_equal(lexicon.df, df):
        return rows, (f"write {head['seq']}: lexicon n_docs {lexicon.n_docs} total {lexicon.total_len}, rows "
                      f"{len(rows)} total {total}, df differ at {np.flatnonzero(lexicon.df != df)[:5]}")
    if int(head["manifest"]["num_docs"]) != len(rows):
        return rows, f"write {head['seq']}: manifest counts {head['manifest']['num_docs']}, rows {len(rows)}"
    return rows, None


_local = threading.local()


def _pause(name: str) -> None:
    """The step hook: a writer thread pauses with its schedule's probability for up to its longest pause."""
    r = getattr(_local, "rng", None)
    if r is not None and r.random() < _local.p:
        time.sleep(r.uniform(0, _local.most))


def _whole(shown: dict[str, str], base: dict[str, str], ops: list[dict]) -> bool:
    """Whether ``shown`` (id -> text), on one writer's ids (``base``: its original documents), is the state after
    the first k of its writes for some k, the failed ones left out (the last may still run)."""
    ids = {*base, *(d for op in ops for d in op["after"])}
    state = dict(base)
    candidates = [dict(state)]
    for op in ops:
        if op.get("ok") is not False:
            state.update(op["after"])
        candidates.append({d: t for d, t in state.items() if t is not None})
    mine = {d: t for d, t in shown.items() if d in ids}
    return any(mine == {d: t for d, t in c.items() if t is not None} for c in candidates)


def run_schedule(client, uri: str, collection: str, root: Path, seed: int, *, writers: int, lease: float,
                 p: float, pauses: float) -> dict:
    """One schedule (see the module's docstring): ``{"errors": [...], "succeeded", "failed", "samples"}``."""
    rng = np.random.default_rng(seed)
    texts = build(client, uri, collection, root, rng)
    store = _Store(client, uri, collection, root)
    owned = {w: [f"o{i}" for i in range(w, 12, writers)] for w in range(writers)}
    ops: list[dict] = []
    by_writer: dict[int, list[dict]] = {w: [] for w in range(writers)}
    errors: list[str] = []
    done = threading.Event()

    def plan(w: int) -> list[dict]:
        r = np.random.default_rng([seed, w])
        mine, out = {}, []
        for kind in r.permutation(["add", "replace", "remove"]):
            if kind == "add":
                new = {f"w{w}n{len(out)}x{j}": _text(r) for j in range(3)}
                out.append({"kind": "add", "after": new, "before": {d: None for d in new}})
                mine.update(new)
            elif kind == "replace" and mine:
                d = sorted(mine)[0]
                out.append({"kind": "replace", "after": {d: _text(r) + " again"}, "before": {d: mine[d]}})
            else:
                d = owned[w].pop()
                out.append({"kind": "remove", "after": {d: None}, "before": {d: texts[d]}})
        return out

    def writer(w: int) -> None:
        _local.rng, _local.p, _local.most = random.Random(seed * 7919 + w), p, pauses * lease
        for op in plan(w):
            ops.append(op)
            by_writer[w].append(op)
            try:
                if op["kind"] == "remove":
                    write(store, remove=list(op["after"]), show_progress=False)
                else:
                    new = NewDocs(list(op["after"]), [""] * len(op["after"]), list(op["after"].values()),
                                  _vectors(len(op["after"]), np.random.default_rng(seed)))
                    write(store, docs=new, replace=op["kind"] == "replace", show_progress=False)
                op["ok"] = True
            except TakenOver as exc:
                assert "nothing of this write is visible" in str(exc), exc
                op["ok"] = False
                if op["kind"] == "add":  # its documents never came: a later replace of them is refused; skip it
                    break
            except Exception as exc:  # noqa: BLE001 - any other failure is a finding
                errors.append(f"writer {w}: {type(exc).__name__}: {exc}")
                op["ok"] = False
                break

    samples = 0

    def reader() -> None:
        nonlocal samples
        state = State(client, uri, collection)
        while not done.is_set():
            try:
                head = state.head()
                rows, wrong = recount(client, collection, head)
            except IndexStoreError as exc:  # a sample that came as later writes cleaned its state: again
                assert "is gone" in str(exc), exc
                continue
            if state.latest()[0] != int(head["seq"]):  # a later write deleted rows this one showed: sample again
                continue
            samples += 1
            if wrong:
                errors.append(wrong)
            shown = {r["id"]: r["text"] for r in rows}
            for w in range(writers):
                if not _whole(shown, {d: texts[d] for d in texts if int(d[1:]) % writers == w},
                              list(by_writer[w])):
                    errors.append(f"write {head['seq']} shows writer {w}'s writes in part: {shown}")

    st.set_step_hook(_pause)
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    watcher = threading.Thread(target=reader)
    for t in (*threads, watcher):
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    state = State(client, uri, collection)
    head = state.head()
    rows, wrong = recount(client, collection, head)
    if wrong:
        errors.append(wrong)
    shown = {r["id"]: r["text"] for r in rows}
    expected = dict(texts)  # the writes that succeeded, each writer's in its order (writers touch their own ids)
    for op in ops:
        if op.get("ok"):
            expected.update(op["after"])
    expected = {d: t for d, t in expected.items() if t is not None}
    if shown != expected:
        errors.append(f"final state: {sorted(set(shown.items()) ^ set(expected.items()))}")
    return {"errors": errors, "succeeded": sum(1 for o in ops if o.get("ok")),
            "failed": sum(1 for o in ops if o.get("ok") is False), "samples": samples, "writes": int(head["seq"]) - 1}
