"""The writers' lease on a Milvus index: writers take turns, so that they rarely compete.

The lease keeps writers from wasting work, it is not what keeps writes whole: Milvus has no compare-and-set, and a
writer can pause (a GC pause, a starved CPU, a slow network) past any timing a lease relies on. What decides which
attempt becomes a write is the consensus on the state rows (:mod:`.consensus`), safe under any pause; a writer that
stalls past its lease finds out at its next renewal (or when it proposes) and fails with nothing of its write
visible.

The lease is taken as in Fischer's mutual-exclusion algorithm: wait until the ``lock`` row names no live owner, write
your own name, wait ``settle`` seconds (longer than a write of that row takes), and read it back: if it still names
you, the lease is yours; else another writer won the race and you wait again. A lease runs for :data:`LEASE_S`
seconds (``TWOTOWER_MILVUS_LEASE_S``) and is renewed on every batch, so a killed writer blocks others for at most that
long, and not at all on its own machine: the row names the host and process, and a writer there sees that the
process is gone (a rerun after ``kill -9`` starts at once). ``settle`` comes from ``TWOTOWER_MILVUS_LOCK_SETTLE``
(default 0.2 s).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus.state import LOCK, State, crash_point

log = logging.getLogger(__name__)

SETTLE_ENV = "TWOTOWER_MILVUS_LOCK_SETTLE"  # seconds a writer waits before checking that the lease is still its own
LEASE_ENV = "TWOTOWER_MILVUS_LEASE_S"  # a writer's lease in seconds (tests shorten it)
LEASE_S = 60.0


class TakenOver(IndexStoreError):
    """Another writer took over this write's lease or number: nothing of this write is visible."""


def lease_seconds() -> float:
    return float(os.environ.get(LEASE_ENV, LEASE_S))


class EngineLock:
    """Writers of one collection take turns, across processes and machines, through the ``lock`` row."""

    def __init__(self, state: State, *, timeout: float = 600.0) -> None:
        self.state, self.timeout = state, timeout
        self.owner = uuid.uuid4().hex
        self.settle = float(os.environ.get(SETTLE_ENV, "0.2"))
        self.lease = lease_seconds()

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
                crash_point("lease-free")
                self._write(time.time() + self.lease)
                time.sleep(self.settle)
                holder = self._holder()
                if holder is not None and holder["owner"] == self.owner:
                    return self
            if time.monotonic() > deadline:
                raise IndexStoreError(f"Milvus collection '{self.state.collection}' at {self.state.uri}: another "
                                      f"writer has held the write lease for over {self.timeout:.0f} s; try again")
            time.sleep(0.05 + self.settle * (uuid.uuid4().int % 100) / 100)

    def stalled(self) -> TakenOver:
        return TakenOver(f"Milvus collection '{self.state.collection}' at {self.state.uri}: this write stalled past "
                         f"its {self.lease:g} s lease and another writer took over; nothing of this write is visible: "
                         "run it again")

    def renew(self) -> None:
        """Extend the lease; :class:`TakenOver` (nothing written) when another writer holds it now."""
        crash_point("renew")
        holder = self._holder()
        if holder is None or holder["owner"] != self.owner:
            raise self.stalled()
        self._write(time.time() + self.lease)

    def __exit__(self, *exc) -> None:
        try:
            if (self._holder() or {}).get("owner") == self.owner:
                self._write(0.0)
        except Exception:  # the lease runs out by itself
            log.debug("releasing the Milvus write lease failed", exc_info=True)


__all__ = ["LEASE_ENV", "LEASE_S", "SETTLE_ENV", "EngineLock", "TakenOver", "lease_seconds"]
