"""The index's state in Milvus itself: a second collection, ``<collection>__state``, beside the documents.

Rows (``key`` -> ``value``, a string; a 2-d placeholder vector because a Milvus collection needs one):

- ``head``: the commit point, JSON ``{"seq", "manifest", "blobs", "blobs_seq", "deltas", "write"}``. ``seq`` is the
  last committed write (the build is 1); a document row is visible to a reader of ``seq`` C when ``added <= C`` and it
  was not removed at or before C (:func:`visible`). ``manifest`` is the index's manifest (document count, BM25
  settings, corpus fingerprint); ``blobs_seq`` names the write whose blob rows hold the whole BM25 lexicon
  (``blobs``: their chunks per file) and ``deltas`` the writes after it whose delta rows, applied in order, bring it
  to C (:func:`lexicon_chain`); ``write`` is the digest of the last committed write, so that rerunning it is a
  no-op. One upsert of this row publishes a write: a reader sees all of it or none of it.
- ``blob:<seq>:<file>:<n>``: the lexicon's files (vocabulary, document frequencies, average length), base64 in
  chunks; term ids are assigned here, by the one writer holding the lock, never by a local folder.
- ``delta:<seq>:<n>``: what write ``seq`` changed in the lexicon (:meth:`.lexical.SparseBM25.delta`: new terms, the
  df of the terms it touched, the document count), JSON in chunks. A write stores only that; every
  :data:`MAX_DELTAS`-th write, or one whose deltas would outweigh the whole lexicon, stores the whole lexicon again.
- ``lock``: the writers' lease, JSON ``{"owner", "until"}`` (see :class:`EngineLock`).

The crash hook: ``TWOTOWER_MILVUS_CRASH_AT=<point>`` kills the process (SIGKILL) when a write reaches ``<point>``
(``recovered``, ``batch:<i>``, ``marked``, ``before-flush``, ``after-flush``, ``blobs``, ``committed``): the fault-
injection tests use it; nothing sets it otherwise.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.lexical import SparseBM25

log = logging.getLogger(__name__)

CRASH_ENV = "TWOTOWER_MILVUS_CRASH_AT"
SETTLE_ENV = "TWOTOWER_MILVUS_LOCK_SETTLE"  # seconds a writer waits before checking that the lease is still its own
LEASE_S = 60.0  # a writer's lease; renewed on every batch, so only a dead writer's lease runs out
CHUNK = 60_000  # characters of base64 (or ASCII JSON) per blob or delta row (Milvus' VARCHAR holds 65,535 bytes)
MAX_DELTAS = 16  # deltas a reader applies at most before the whole lexicon is stored again
HEAD, LOCK = "head", "lock"


def crash_point(name: str) -> None:
    """SIGKILL this process when ``TWOTOWER_MILVUS_CRASH_AT`` names ``name`` (fault injection)."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def visible(seq: int) -> str:
    """The filter of the document rows a reader of committed write ``seq`` sees."""
    return f"added <= {int(seq)} and (removed == 0 or removed > {int(seq)})"


def lexicon_chain(head: dict) -> list[int]:
    """The writes whose rows make up the lexicon of ``head``: the whole one's, then each delta's."""
    return [int(head["blobs_seq"]), *(int(seq) for seq, _ in head.get("deltas", []))]


def state_name(collection: str) -> str:
    return f"{collection}__state"[:255]


def create_state(client, collection: str, uri: str) -> None:
    """The state collection of ``collection`` (``key``, ``value``, a placeholder vector)."""
    from pymilvus import DataType

    name = state_name(collection)
    with mc.milvus_errors(uri, name, "creating the state collection"):
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=512)
        schema.add_field("value", DataType.VARCHAR, max_length=mc.MAX_VARCHAR)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
        params = client.prepare_index_params()
        params.add_index("vec", index_type="FLAT", metric_type="L2")
        client.create_collection(name, schema=schema, index_params=params, consistency_level="Strong")


class State:
    """Reads and writes of one index's state collection."""

    def __init__(self, client, uri: str, collection: str) -> None:
        self.client, self.uri, self.collection = client, uri, collection
        self.name = state_name(collection)

    def _errors(self, what: str):
        return mc.milvus_errors(self.uri, self.name, what)

    def load(self) -> None:
        with self._errors("loading the state collection"):
            if not self.client.has_collection(self.name):
                raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri} has no '{self.name}' "
                                      "collection beside it (dropped, or built by an older twotower): rebuild the index")
            self.client.load_collection(self.name)

    def _put(self, rows: dict[str, str]) -> None:
        with self._errors("writing the index state"):
            self.client.upsert(self.name, [{"key": k, "value": v, "vec": [0.0, 0.0]} for k, v in rows.items()])

    def _get(self, keys: list[str]) -> dict[str, str]:
        with self._errors("reading the index state"):
            found = self.client.query(self.name, filter=mc.ids_filter(keys, "key"), output_fields=["key", "value"])
        return {e["key"]: e["value"] for e in found}

    # ---- the commit point ----------------------------------------------------------------

    def head(self) -> dict:
        value = self._get([HEAD]).get(HEAD)
        if value is None:
            raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri} has no committed state (its "
                                  f"'{self.name}' collection holds no head: a build that did not finish, or an "
                                  "index built by an older twotower); rebuild the index")
        return json.loads(value)

    def commit(self, head: dict) -> None:
        """Publish ``head``: one row, written at once (the write's commit point), then flushed."""
        self._put({HEAD: json.dumps(head, sort_keys=True)})
        crash_point("committed")
        with self._errors("flushing the index state"):
            self.client.flush(self.name)

    # ---- the lexicon ---------------------------------------------------------------------

    def save_lexicon(self, seq: int, lexicon: SparseBM25) -> dict[str, int]:
        """Write the lexicon's files as blob rows of write ``seq``; ``{file: chunks}``."""
        with tempfile.TemporaryDirectory(prefix="twotower-lexicon-") as tmp:
            names = lexicon.save(Path(tmp))
            rows, chunks = {}, {}
            for name in names:
                data = base64.b64encode((Path(tmp) / name).read_bytes()).decode("ascii")
                parts = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
                chunks[name] = len(parts)
                rows.update({f"blob:{seq}:{name}:{i}": part for i, part in enumerate(parts)})
        keys = list(rows)
        for i in range(0, len(keys), 16):
            self._put({k: rows[k] for k in keys[i:i + 16]})
        return chunks

    def save_delta(self, seq: int, data: str) -> int:
        """Write a lexicon's delta (:meth:`.lexical.SparseBM25.delta` as ASCII JSON) as the rows of write ``seq``; their
        number."""
        parts = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
        rows = {f"delta:{seq}:{i}": part for i, part in enumerate(parts)}
        keys = list(rows)
        for i in range(0, len(keys), 16):
            self._put({k: rows[k] for k in keys[i:i + 16]})
        return len(parts)

    def _rows(self, keys: list[str], seq: int) -> dict[str, str]:
        found: dict[str, str] = {}
        for i in range(0, len(keys), 16):
            found.update(self._get(keys[i:i + 16]))
        if len(found) != len(keys):
            raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri}: the BM25 vocabulary of write "
                                  f"{seq} is gone (a later write replaced it meanwhile); open the index again")
        return found

    def load_lexicon(self, head: dict) -> SparseBM25:
        """The lexicon of committed write ``head``: the whole one it names, with its deltas applied in order."""
        seq, blobs = int(head["blobs_seq"]), head["blobs"]
        found = self._rows([f"blob:{seq}:{name}:{i}" for name, n in blobs.items() for i in range(n)], seq)
        with tempfile.TemporaryDirectory(prefix="twotower-lexicon-") as tmp:
            for name, n in blobs.items():
                data = "".join(found[f"blob:{seq}:{name}:{i}"] for i in range(n))
                (Path(tmp) / name).write_bytes(base64.b64decode(data))
            lexicon = SparseBM25.load(Path(tmp))
        for delta_seq, n in head.get("deltas", []):
            keys = [f"delta:{delta_seq}:{i}" for i in range(n)]
            found = self._rows(keys, int(delta_seq))
            lexicon.apply(json.loads("".join(found[k] for k in keys)))
        return lexicon

    def drop_blobs_except(self, keep: set[int]) -> None:
        """Delete the lexicon rows (whole and delta) of every write not in ``keep`` (older ones, and those of a write
        that never committed)."""
        with self._errors("cleaning the index state"):
            keys = [e["key"] for e in self.client.query(self.name, filter='key like "blob:%" or key like "delta:%"',
                                                        output_fields=["key"])]
            stale = [k for k in keys if int(k.split(":", 2)[1]) not in keep]
            for i in range(0, len(stale), 256):
                self.client.delete(self.name, filter=mc.ids_filter(stale[i:i + 256], "key"))


class EngineLock:
    """Writers of one collection take turns, across processes and machines, through the ``lock`` row.

    Milvus has no compare-and-set, so the lease is taken as in Fischer's mutual-exclusion algorithm: wait until the
    row names no live owner, write your own name, wait ``settle`` seconds (longer than a write of that row takes),
    and read it back — if it still names you, the lease is yours; else another writer won the race and you wait
    again. A lease runs for :data:`LEASE_S` seconds and is renewed on every batch (:meth:`renew`), so a killed writer
    blocks others for at most that long — and not at all on its own machine: the row names the host and process,
    and a writer there sees that the process is gone (a rerun after ``kill -9`` starts at once). ``settle`` comes from ``TWOTOWER_MILVUS_LOCK_SETTLE`` (default 0.2 s)."""

    def __init__(self, state: State, *, timeout: float = 600.0) -> None:
        self.state, self.timeout = state, timeout
        self.owner = uuid.uuid4().hex
        self.settle = float(os.environ.get(SETTLE_ENV, "0.2"))

    def _holder(self) -> dict | None:
        value = self.state._get([LOCK]).get(LOCK)
        return json.loads(value) if value else None

    def _write(self, until: float) -> None:
        self.state._put({LOCK: json.dumps({"owner": self.owner, "until": until, "host": socket.gethostname(),
                                           "pid": os.getpid()})})

    def _free(self, holder: dict | None) -> bool:
        if holder is None or holder["owner"] == self.owner or holder["until"] < time.time():
            return True
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            try:
                os.kill(holder["pid"], 0)
            except ProcessLookupError:  # its writer died on this machine
                return True
            except OSError:
                return False
        return False

    def __enter__(self) -> "EngineLock":
        deadline = time.monotonic() + self.timeout
        while True:
            holder = self._holder()
            if self._free(holder):
                self._write(time.time() + LEASE_S)
                time.sleep(self.settle)
                holder = self._holder()
                if holder is not None and holder["owner"] == self.owner:
                    return self
            if time.monotonic() > deadline:
                raise IndexStoreError(f"Milvus collection '{self.state.collection}' at {self.state.uri}: another "
                                      f"writer has held the write lease for over {self.timeout:.0f} s; try again")
            time.sleep(0.05 + self.settle * (uuid.uuid4().int % 100) / 100)

    def renew(self) -> None:
        """Extend the lease; an error when another writer took it (this writer stalled past its lease)."""
        holder = self._holder()
        if holder is None or holder["owner"] != self.owner:
            raise IndexStoreError(f"Milvus collection '{self.state.collection}' at {self.state.uri}: this write "
                                  f"stalled past its {LEASE_S:.0f} s lease and another writer took over; nothing of it "
                                  "was published: run it again")
        self._write(time.time() + LEASE_S)

    def __exit__(self, *exc) -> None:
        try:
            if (self._holder() or {}).get("owner") == self.owner:
                self._write(0.0)
        except Exception:  # the lease runs out by itself
            log.debug("releasing the Milvus write lease failed", exc_info=True)
