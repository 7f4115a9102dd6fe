"""Which attempt is write N: consensus over plain reads and writes of state rows, safe under any pause.

Milvus has no compare-and-set, so this is Disk Paxos (Gafni and Lamport, 2003) on one disk: each attempt T has a
block of its own, the row ``px:<N>:<T>`` = ``{"mbal", "bal", "inp"}``, that only it writes; a ballot is
``[round, T]``, unique because tokens are. To propose its value v, an attempt

1. (prepare) writes ``mbal`` = a ballot above every one it has seen, then reads every block of N: if one holds a
   higher ``mbal`` it starts over; else it takes, of the blocks that accepted something, the value of the highest
   ``bal`` (else its own v);
2. (accept) writes ``bal`` = ``mbal`` and ``inp`` = that value, then reads every block again: if one holds a higher
   ``mbal`` it starts over; else the value is decided. It writes ``dec:<N>`` (every attempt that decides writes the
   same value) and returns it.

Why it is safe with any pause: a write that completed before a read started is seen by that read (Milvus' strong
consistency). If value v was decided at ballot b, then an attempt with a higher ballot b' either read v's accept
(and so proposes v, or a value decided at a ballot between, which is v by induction), or its read ended before that
accept was written; then its prepare was written before that, and the accepting attempt's second read saw b' > b
and did not decide. So every decision of N is the same value, and no attempt that paused anywhere can change it.
A decision row, once written, ends the round for every later reader; blocks are deleted only after it exists.
"""

from __future__ import annotations

import json
import random
import time

from twotower.retrieval.index.errors import IndexStoreError
from twotower.retrieval.milvus.state import State, crash_point

DEADLINE_S = 600.0  # an attempt that cannot learn the decision for this long gives up (the outcome then unknown)


def _blocks(state: State, seq: int) -> tuple[dict[int, dict], dict | None]:
    """Every attempt's block for write ``seq`` and the decision, when there is one."""
    rows = state._matching([f"px:{seq}:"], [f"dec:{seq}"])  # one query (each waits for a server's time tick)
    decision = rows.pop(f"dec:{seq}", None)
    blocks = {int(k.rsplit(":", 1)[1]): json.loads(v) for k, v in rows.items()}
    return blocks, (json.loads(decision) if decision is not None else None)


def decide(state: State, seq: int, token: int, value: dict) -> dict:
    """Propose ``value`` (``{"token": token, …}``) as write ``seq`` by attempt ``token``; the decided value (this
    one, or another attempt's)."""
    deadline = time.monotonic() + DEADLINE_S
    mine: dict = {"mbal": [0, token], "bal": None, "inp": None}
    top = 0
    while True:
        blocks, decision = _blocks(state, seq)
        if decision is not None:
            return decision
        top = max([top, *(int(b["mbal"][0]) for b in blocks.values())]) + 1
        ballot = [top, token]
        mine = {"mbal": ballot, "bal": mine["bal"], "inp": mine["inp"]}
        state._put({f"px:{seq}:{token}": json.dumps(mine)})
        crash_point("phase1")
        blocks, decision = _blocks(state, seq)
        if decision is not None:
            return decision
        if not any(b["mbal"] > ballot for t, b in blocks.items() if t != token):
            accepted = [b for b in blocks.values() if b.get("bal")]
            chosen = max(accepted, key=lambda b: b["bal"])["inp"] if accepted else value
            mine = {"mbal": ballot, "bal": ballot, "inp": chosen}
            state._put({f"px:{seq}:{token}": json.dumps(mine)})
            crash_point("phase2")
            blocks, decision = _blocks(state, seq)
            if decision is not None:
                return decision
            if not any(b["mbal"] > ballot for t, b in blocks.items() if t != token):
                state._put({f"dec:{seq}": json.dumps(chosen)})
                crash_point("decided")
                return chosen
        if time.monotonic() > deadline:
            raise IndexStoreError(f"Milvus collection '{state.collection}' at {state.uri}: other writers kept "
                                  f"competing for write {seq} for {DEADLINE_S:.0f} s; whether this write is visible "
                                  "is unknown: open the index and look before running it again")
        time.sleep(random.uniform(0.01, 0.1))  # another attempt holds a higher ballot: let it finish


__all__ = ["decide"]
