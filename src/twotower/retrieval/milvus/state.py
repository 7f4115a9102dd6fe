"""The index's state in Milvus itself: a second collection, ``<collection>__state``, beside the documents.

A write is numbered: write N follows the committed write N − 1 (the build is 1). Any number of *attempts* may try to
be write N at once (a writer paused past its lease and one that took over); each has a random token T of its own and
writes everything it needs under that token, invisible; which attempt *is* write N is decided by consensus on the
state rows (:mod:`.consensus`), safe however long any attempt pauses. Rows (``key`` -> ``value``, a string; a 2-d
placeholder vector because a Milvus collection needs one):

- ``dec:<N>``: the decision, JSON ``{"token": T}``: attempt T is write N. Written once per number (every attempt
  that learns the decision writes the same value), never deleted. The committed state is the highest N with a
  decision; ``head`` (``{"seq": N}``) is a hint where to start looking.
- ``value:<N>:<T>:<i>``: attempt T's head (:meth:`State.head`), JSON in chunks: ``seq``, ``manifest`` (document
  count, BM25 settings, corpus fingerprint), the lexicon's rows (``blobs`` of the whole one written by the attempt
  ``blobs_of``, then ``deltas``), ``write`` (the digest that makes a rerun a no-op), ``losers`` (the tokens of every
  attempt that lost before write N: their rows stay hidden for good) and ``removed`` (how many ``rm`` chunks).
- ``reg:<N>:<T>``: attempt T registered for number N *before* writing any row; it then checks that N is still
  undecided. So a reader who sees ``dec:N`` and then reads the registrations of N knows every attempt that can ever
  hold rows of N: all but the winner are losers, hidden.
- ``px:<N>:<T>``: attempt T's consensus block for N (:mod:`.consensus`); deleted once ``dec:N`` is written.
- ``rm:<N>:<T>:<i>``: the row keys attempt T replaces or removes (JSON in chunks). Rows are never marked by an
  attempt: once T is write N, its rows are marked ``removed = N`` (by T, or by the next writer if T stopped), then
  ``marked:<N>`` is written. A reader of N whose ``marked:N`` is missing hides those keys by name instead.
- ``blob:<N>:<T>:<file>:<n>`` and ``delta:<N>:<T>:<n>``: the BM25 lexicon, whole (base64) or as what attempt T
  changed in it (:meth:`.lexical.SparseBM25.delta`), in chunks; term ids are assigned by the attempt that wins.
- ``wrote:<digest>:<N>:<T>``: attempt T at N makes the write of this digest (its head's ``write``). Written with
  its head and never deleted (like ``dec:``): the same write run again after a crash finds it committed whatever
  writes came after (:func:`.writes.done_before`). A losing attempt's row stays and counts for nothing.
- ``lock``: the writers' lease (:mod:`.lease`), which keeps writers taking turns but is not what makes writes safe.

Document rows carry ``added`` (N), ``attempt`` (T) and ``removed`` (0, or the number of the write that removed them);
a reader of write C sees the rows with ``added <= C``, not removed at or before C, not written by a loser and not in
C's unmarked removals (:func:`visible`). A reader's queries are separate reads (Milvus has no read at a past
timestamp), so it is these numbers that pin them to one write; rows removed by write R are deleted for good only by
write R + 2 or later (its settle runs on a committed write past R), so a reader of C reads C whole until write C + 2
is decided (:meth:`State.intact`).

The test hook: every step of a write calls :func:`crash_point` with its name (in order: ``lease-free``,
``recovered``, ``registered``, ``batch:<i>`` with ``renew`` after each, ``before-flush``, ``after-flush``,
``blobs``, ``renew``, ``proposing``, ``phase1``, ``phase2``, ``decided``, ``committed``, ``marking``, ``marked``). ``TWOTOWER_MILVUS_CRASH_AT=<name>`` kills the process there (SIGKILL);
``TWOTOWER_MILVUS_PAUSES=<p>:<max_s>`` sleeps a random 0 to ``max_s`` seconds at each step with probability ``p``;
:func:`set_step_hook` calls a function there (the concurrency tests' random pauses). Nothing sets them otherwise.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.lexical import SparseBM25

log = logging.getLogger(__name__)

CRASH_ENV = "TWOTOWER_MILVUS_CRASH_AT"
PAUSES_ENV = "TWOTOWER_MILVUS_PAUSES"  # "<probability>:<max seconds>": random pauses at every step (tests)
CHUNK = 60_000  # characters of base64 (or ASCII JSON) per row (Milvus' VARCHAR holds 65,535 bytes)
MAX_DELTAS = 16  # deltas a reader applies at most before the whole lexicon is stored again
HEAD, LOCK = "head", "lock"
PROBE = 32  # decision rows asked for at once when looking for the latest

_step_hook: Callable[[str], None] | None = None


def set_step_hook(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(name)`` at every step of every write in this process (``None``: stop). For tests: pausing a
    writer anywhere must never make a write half-visible."""
    global _step_hook
    _step_hook = hook


def crash_point(name: str) -> None:
    """A step of a write: the test hook (:func:`set_step_hook`), a random pause (``TWOTOWER_MILVUS_PAUSES``), or a
    SIGKILL of this process (``TWOTOWER_MILVUS_CRASH_AT`` naming ``name``)."""
    if _step_hook is not None:
        _step_hook(name)
    pauses = os.environ.get(PAUSES_ENV)
    if pauses:
        p, most = (float(x) for x in pauses.split(":"))
        if random.random() < p:
            time.sleep(random.uniform(0, most))
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def new_token() -> int:
    """A write attempt's token: random, positive, never 0 (0 is no attempt)."""
    return random.SystemRandom().randrange(1, 2**62)


def visible(head: dict) -> str:
    """The filter of the document rows a reader of the committed write ``head`` sees (see the module's docstring)."""
    seq = int(head["seq"])
    expr = f"added <= {seq} and (removed == 0 or removed > {seq})"
    if head.get("hidden"):
        expr += f" and attempt not in [{', '.join(str(int(t)) for t in head['hidden'])}]"
    if head.get("pending"):
        expr += f" and not ({mc.ids_filter(head['pending'], 'pk')})"
    return expr


def documents_visible(head: dict) -> str:
    """The filter of the documents a reader of ``head`` sees: their own rows (passage 0), one per document, not the
    rows of their further passages (:mod:`.client`'s schema)."""
    return f"({visible(head)}) and passage == 0"


def lexicon_chain(head: dict) -> list[list[int]]:
    """The ``[write, token]`` of the rows that make up the lexicon of ``head``: the whole one's, then each delta's."""
    return [list(map(int, head["blobs_of"])), *([int(n), int(t)] for n, t, _ in head.get("deltas", []))]


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


def _chunks(data: str) -> list[str]:
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]


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
            mc.load_collection(self.client, self.name, self.uri)

    def _put(self, rows: dict[str, str]) -> None:
        keys = list(rows)
        with self._errors("writing the index state"):
            for i in range(0, len(keys), 16):
                self.client.upsert(self.name, [{"key": k, "value": rows[k], "vec": [0.0, 0.0]} for k in keys[i:i + 16]])

    def _get(self, keys: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        with self._errors("reading the index state"):
            for i in range(0, len(keys), 64):
                for e in self.client.query(self.name, filter=mc.ids_filter(keys[i:i + 64], "key"),
                                           output_fields=["key", "value"]):
                    found[e["key"]] = e["value"]
        return found

    def _prefixed(self, prefix: str, value: bool = True) -> dict[str, str]:
        """Every row whose key starts with ``prefix`` (a literal without ``%`` or ``_`` wildcards that matter)."""
        return self._matching([prefix], value=value)

    def _matching(self, prefixes: Sequence[str], keys: Sequence[str] = (), value: bool = True) -> dict[str, str]:
        """Every row whose key starts with one of ``prefixes`` or is one of ``keys``, in ONE query: on a server each
        query of a collection with strong consistency waits for the server's next time tick (200 ms by default)."""
        where = [f"key like {mc.quote(p + '%')}" for p in prefixes]
        where += [mc.ids_filter(list(keys), "key")] if keys else []
        with self._errors("reading the index state"):
            found = self.client.query(self.name, filter=" or ".join(where),
                                      output_fields=["key", "value"] if value else ["key"])
        wanted = set(keys)
        return {e["key"]: e.get("value", "") for e in found
                if e["key"] in wanted or any(e["key"].startswith(p) for p in prefixes)}

    def _delete(self, keys: list[str]) -> None:
        with self._errors("cleaning the index state"):
            for i in range(0, len(keys), 256):
                self.client.delete(self.name, filter=mc.ids_filter(keys[i:i + 256], "key"))

    def _put_chunks(self, prefix: str, data: str) -> int:
        parts = _chunks(data)
        self._put({f"{prefix}:{i}": part for i, part in enumerate(parts)})
        return len(parts)

    def _get_chunks(self, prefix: str, n: int, what: str) -> str:
        keys = [f"{prefix}:{i}" for i in range(n)]
        found = self._get(keys)
        if len(found) != n:
            raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri}: {what} is gone (a later write "
                                  "replaced it meanwhile); open the index again")
        return "".join(found[k] for k in keys)

    # ---- the committed write ------------------------------------------------------------------

    def latest(self) -> tuple[int, int]:
        """``(N, token)`` of the latest decided write."""
        hint = self._get([HEAD]).get(HEAD)
        if hint is None:
            raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri} has no committed state (its "
                                  f"'{self.name}' collection holds no head: a build that did not finish, or an "
                                  "index built by an older twotower); rebuild the index")
        seq, token = int(json.loads(hint)["seq"]), None
        while True:  # the hint is written after the decision, and may lag (a writer stopped, or paused, before it)
            found = self._get([f"dec:{n}" for n in range(seq, seq + PROBE)])
            n = seq
            while f"dec:{n}" in found:
                token = int(json.loads(found[f"dec:{n}"])["token"])
                n += 1
            if token is None:  # the hint names a write without a decision: cannot happen; look at them all
                decided = {int(k.split(":")[1]): v for k, v in self._prefixed("dec:").items()}
                if not decided:
                    raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri}: no committed write")
                top = max(decided)
                return top, int(json.loads(decided[top])["token"])
            if n < seq + PROBE:
                return n - 1, token
            seq = n

    def decided(self, seq: int) -> int | None:
        """The token of write ``seq``, None while undecided."""
        value = self._get([f"dec:{seq}"]).get(f"dec:{seq}")
        return None if value is None else int(json.loads(value)["token"])

    def head(self) -> dict:
        """The committed write's head (its value, see the module's docstring) with what a reader hides: ``hidden``
        (the tokens of every losing attempt up to it) and ``pending`` (its removals while their rows are unmarked)."""
        seq, token = self.latest()
        rows = self._matching([f"value:{seq}:{token}:", f"reg:{seq}:"], [f"marked:{seq}"])  # one query, not four
        head = self._value_of(rows, seq, token)
        registered = {int(k.rsplit(":", 1)[1]) for k in rows if k.startswith(f"reg:{seq}:")}
        head["hidden"] = sorted({*map(int, head.get("losers", [])), *(registered - {token})})
        head["pending"] = [] if f"marked:{seq}" in rows else self.removals(seq, token, head)
        return head

    def intact(self, seq: int) -> bool:
        """Whether everything a reader of write ``seq`` reads is still there (one cheap query): rows a write removes
        are deleted for good, and the state rows of a write dropped, only by a write that settles after the next one
        (``removed`` below the committed write's number, :func:`.writes.settle`; :meth:`clean` keeps the committed
        write's and the one before's), so until write ``seq + 2`` is decided a reader of ``seq`` reads its write
        whole. A reader that asks this after its queries knows they all read the same committed write."""
        return self.decided(seq + 2) is None

    def changed_since(self, seq: int) -> bool:
        """Whether a write after ``seq`` was decided (one cheap query)."""
        return self.decided(seq + 1) is not None

    def _value_of(self, rows: dict[str, str], seq: int, token: int) -> dict:
        """Attempt ``token``'s head at write ``seq`` from ``rows`` (its ``value:`` rows among others)."""
        prefix = f"value:{seq}:{token}:"
        n = rows.get(prefix + "n")
        parts = [rows.get(f"{prefix}{i}") for i in range(int(n))] if n is not None else [None]
        if any(p is None for p in parts):
            raise IndexStoreError(f"Milvus collection '{self.collection}' at {self.uri}: the state of write {seq} is "
                                  "gone (a later write replaced it meanwhile); open the index again")
        return json.loads("".join(parts))

    def save_value(self, head: dict) -> None:
        """Attempt ``head["token"]``'s head, before it proposes itself (invisible until decided)."""
        seq, token = int(head["seq"]), int(head["token"])
        n = self._put_chunks(f"value:{seq}:{token}", json.dumps(head, sort_keys=True))
        done = {f"wrote:{head['write']}:{seq}:{token}": ""} if head.get("write") else {}
        self._put({f"value:{seq}:{token}:n": str(n), **done})

    def committed(self, write: str, upto: int) -> tuple[int, int] | None:
        """``(N, token)`` of the latest attempt that recorded the digest ``write`` (:meth:`save_value`) and was
        decided as write N <= ``upto``; None when none was (never run, or every attempt at it lost)."""
        tried = sorted({(int(n), int(t)) for n, t in (k.rsplit(":", 2)[1:] for k in
                                                      self._prefixed(f"wrote:{write}:", value=False))
                        if int(n) <= upto}, reverse=True)
        decisions = self._get([f"dec:{n}" for n in sorted({n for n, _ in tried})]) if tried else {}
        for n, token in tried:
            decision = decisions.get(f"dec:{n}")
            if decision is not None and int(json.loads(decision)["token"]) == token:
                return n, token
        return None

    def save_removals(self, seq: int, token: int, keys: list[str]) -> int:
        return self._put_chunks(f"rm:{seq}:{token}", json.dumps(keys)) if keys else 0

    def removals(self, seq: int, token: int, head: dict) -> list[str]:
        n = int(head.get("removed", 0))
        return json.loads(self._get_chunks(f"rm:{seq}:{token}", n, f"the removals of write {seq}")) if n else []

    def register(self, seq: int, token: int) -> None:
        self._put({f"reg:{seq}:{token}": ""})

    def registered(self, seq: int) -> set[int]:
        return {int(k.rsplit(":", 1)[1]) for k in self._prefixed(f"reg:{seq}:", value=False)}

    def mark_done(self, seq: int) -> None:
        self._put({f"marked:{seq}": "1"})

    def is_marked(self, seq: int) -> bool:
        return bool(self._get([f"marked:{seq}"]))

    def hint(self, seq: int) -> None:
        self._put({HEAD: json.dumps({"seq": int(seq)})})

    # ---- the lexicon ---------------------------------------------------------------------

    def save_lexicon(self, seq: int, token: int, lexicon: SparseBM25) -> dict[str, int]:
        """Write the lexicon's files as blob rows of attempt ``token`` at write ``seq``; ``{file: chunks}``."""
        with tempfile.TemporaryDirectory(prefix="twotower-lexicon-") as tmp:
            names = lexicon.save(Path(tmp))
            chunks = {}
            for name in names:
                data = base64.b64encode((Path(tmp) / name).read_bytes()).decode("ascii")
                chunks[name] = self._put_chunks(f"blob:{seq}:{token}:{name}", data)
        return chunks

    def save_delta(self, seq: int, token: int, data: str) -> int:
        """A lexicon's delta (:meth:`.lexical.SparseBM25.delta` as ASCII JSON) as rows of attempt ``token``."""
        return self._put_chunks(f"delta:{seq}:{token}", data)

    def load_lexicon(self, head: dict) -> SparseBM25:
        """The lexicon of committed write ``head``: the whole one it names, with its deltas applied in order."""
        seq, token = lexicon_chain(head)[0]
        with tempfile.TemporaryDirectory(prefix="twotower-lexicon-") as tmp:
            for name, n in head["blobs"].items():
                data = self._get_chunks(f"blob:{seq}:{token}:{name}", n, f"the BM25 vocabulary of write {seq}")
                (Path(tmp) / name).write_bytes(base64.b64decode(data))
            lexicon = SparseBM25.load(Path(tmp))
        for delta_seq, delta_token, n in head.get("deltas", []):
            data = self._get_chunks(f"delta:{delta_seq}:{delta_token}", n, f"the BM25 vocabulary of write {delta_seq}")
            lexicon.apply(json.loads(data))
        return lexicon

    # ---- cleaning -----------------------------------------------------------------------

    def clean(self, head: dict, keep: set[tuple[int, int]]) -> None:
        """Delete the state rows no reader of ``head`` or of the write before needs: the lexicon, heads and removals
        of attempts of decided writes other than ``keep`` (``(write, token)``), the consensus blocks of decided writes
        and the registrations before ``head``'s. Rows of writes after ``head`` (attempts now running) stay."""
        seq = int(head["seq"])
        stale = []
        prefixes = ("blob:", "delta:", "value:", "rm:", "px:", "reg:", "marked:")
        found = self._matching(prefixes, value=False)
        for prefix in prefixes:
            for key in (k for k in found if k.startswith(prefix)):
                parts = key.split(":")
                n = int(parts[1])
                if prefix in ("px:",):
                    drop = n <= seq
                elif prefix in ("reg:", "marked:"):
                    drop = n < seq - 1
                else:
                    drop = n <= seq and (n, int(parts[2])) not in keep
                if drop:
                    stale.append(key)
        self._delete(stale)


__all__ = ["CHUNK", "CRASH_ENV", "HEAD", "LOCK", "MAX_DELTAS", "PAUSES_ENV", "State", "crash_point", "create_state",
           "documents_visible", "lexicon_chain", "new_token", "set_step_hook", "state_name", "visible"]

