"""Two attempts deciding write N (``retrieval/milvus/consensus.py``) in the exact orders that break a wrong Disk
Paxos, stepped one state operation at a time (issue #71.11): random pauses (``test_milvus_concurrency.py``, 120
schedules) let two planted bugs through, "decide your own value instead of the highest accepted one" and "skip the
second higher-ballot recheck before deciding"; each order below makes one of them return two different decisions.

Each attempt runs :func:`decide` in a thread of its own, on the same in-memory state (:class:`FakeMilvus`: every call
atomic, as a strongly consistent Milvus's are), through a wrapper that stops it before every read of the blocks and
every row it writes until the test lets that one operation through. The order is the test's alone: no sleeps."""

from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("pymilvus")

from milvus_writers import FakeMilvus  # noqa: E402

from twotower.retrieval.milvus.consensus import decide  # noqa: E402
from twotower.retrieval.milvus.state import State, create_state  # noqa: E402

SEQ = 2
WAIT_S = 20.0  # a proposer that neither reaches its next step nor returns within this long: the test fails


def _kind(rows: dict[str, str]) -> str:
    """What a write of consensus rows is: ``prepare`` (a block without an accepted value), ``accept`` or ``decide``."""
    (key, value), = rows.items()
    if key.startswith("dec:"):
        return "decide"
    return "accept" if json.loads(value).get("bal") else "prepare"


class Proposer:
    """One attempt at write :data:`SEQ`, run in its own thread, that does each state operation (``read`` of the
    blocks, ``prepare``, ``accept``, ``decide``) only when :meth:`step` lets it."""

    def __init__(self, name: str, state: State, cond: threading.Condition, token: int) -> None:
        self.name, self.state, self.cond, self.token = name, state, cond, token
        self.value = {"token": token}
        self.pending: str | None = None  # the operation it waits to do
        self.granted = self.finished = self.free = False  # free: every operation let through (teardown)
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.ops: list[str] = []
        self.thread = threading.Thread(target=self._run, name=f"proposer-{name}", daemon=True)

    # ---- the proposer's side: the State it sees
    @property
    def collection(self) -> str:
        return self.state.collection

    @property
    def uri(self) -> str:
        return self.state.uri

    def _matching(self, *args, **kwargs):
        self._gate("read")
        return self.state._matching(*args, **kwargs)

    def _put(self, rows: dict[str, str]) -> None:
        self._gate(_kind(rows))
        self.state._put(rows)

    def _gate(self, kind: str) -> None:
        with self.cond:
            self.pending = kind
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.granted or self.free, timeout=WAIT_S):
                raise TimeoutError(f"{self.name} waited {WAIT_S} s to {kind}")
            self.granted, self.pending = False, None

    def _run(self) -> None:
        try:
            self.result = decide(self, SEQ, self.token, self.value)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            with self.cond:
                self.finished, self.pending = True, None
                self.cond.notify_all()

    # ---- the test's side
    def start(self) -> "Proposer":
        self.thread.start()
        return self

    def step(self) -> str:
        """Let the proposer do its next operation, and wait until it stops before the one after (or returns); the
        operation's kind, or ``returned``."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.pending is not None or self.finished, timeout=WAIT_S), self.name
            if self.finished:
                return "returned"
            kind = self.pending
            self.ops.append(kind)
            self.granted = True
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: (not self.granted and self.pending is not None) or self.finished,
                                      timeout=WAIT_S), (self.name, kind)
        return kind

    def until(self, kind: str) -> None:
        """Step until the proposer's next operation is ``kind`` (not done yet)."""
        for _ in range(50):
            with self.cond:
                self.cond.wait_for(lambda: self.pending is not None or self.finished, timeout=WAIT_S)
                if self.pending == kind:
                    return
            assert self.step() != "returned", f"{self.name} returned before it would {kind}: {self.ops}"
        raise AssertionError(f"{self.name} never came to {kind}: {self.ops}")

    def finish(self) -> dict:
        """Step it to its return; what :func:`decide` returned."""
        for _ in range(200):
            if self.step() == "returned":
                break
        self.thread.join(WAIT_S)
        assert self.finished and self.error is None, (self.name, self.error, self.ops)
        return self.result


@pytest.fixture
def pair():
    """Attempts A (token 11) and B (token 22) at the same write, on one in-memory state; the state."""
    client = FakeMilvus()
    create_state(client, "c", "fake")
    state = State(client, "fake", "c")
    cond = threading.Condition()
    a, b = Proposer("A", state, cond, 11), Proposer("B", state, cond, 22)
    yield a.start(), b.start(), state
    with cond:  # a test that failed midway: let the threads run out
        a.free = b.free = True
        cond.notify_all()
    a.thread.join(WAIT_S)
    b.thread.join(WAIT_S)


def _decided(state: State) -> dict:
    return json.loads(state._get([f"dec:{SEQ}"])[f"dec:{SEQ}"])


def test_a_later_ballot_that_read_an_accept_decides_that_value(pair):
    """A prepares, reads, accepts its value and rechecks (nothing higher): its decision is next. B then prepares a
    higher ballot, reads A's accept, and must propose A's value, not its own: it accepts, rechecks and decides. Then
    A writes its decision. Deciding one's own value: B returns B, A writes A."""
    a, b, state = pair
    a.until("decide")
    assert a.ops[-2:] == ["accept", "read"]  # accepted, then the recheck
    got_b = b.finish()
    assert b.ops.count("prepare") == 1 and b.ops[-1] == "decide"  # B did not start over: it decided at once
    got_a = a.finish()
    assert got_a == got_b == _decided(state) == a.value


def test_a_prepare_between_a_read_and_its_accept_stops_the_accept_from_deciding(pair):
    """A prepares and reads (nothing higher, nothing accepted); B's prepare, with a higher ballot, lands before A's
    accept. A accepts and rechecks: it must see B's ballot and start over. B accepts, rechecks and decides its value
    while A's decision would still be pending; then A learns B's. Skipping the recheck: A decides A, B decides B."""
    a, b, state = pair
    a.until("accept")
    b.until("accept")  # B read A's prepare, not its accept: B proposes its own value
    assert b.ops[-2:] == ["prepare", "read"] and "accept" not in b.ops
    assert a.step() == "accept"
    a.step()  # the recheck
    got_b = b.finish()
    got_a = a.finish()
    assert got_a == got_b == _decided(state) == b.value
    assert a.ops.count("prepare") == 1  # A learnt the decision on starting over: no second ballot was needed
