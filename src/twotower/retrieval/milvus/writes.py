"""Writing to a Milvus-backed index so that no crash and no pause can half-do it, and rerunning it finishes it.

A write (add, replace, remove) runs under the collection's write lease (:class:`.lease.EngineLock`, which keeps
writers taking turns) and the index folder's writer lock. It is an *attempt*, with a random token T, at becoming write
N = the committed C + 1 (:mod:`.state` describes the rows):

1. *Settle* what C and the writes before it left: C's removals marked (if C's writer stopped before), rows removed
   by committed writes deleted for good, rows of losing attempts deleted, stale state rows dropped. Idempotent, and
   it only ever touches what a committed decision determines, so a settler that pauses cannot undo anything.
2. If this write's digest was committed (by C, or by an earlier write whose rows later writes left as they were), it
   is done: nothing more (a rerun after a kill that came after the decision: :func:`done_before`).
3. Register as an attempt at N, then check that N is still undecided (else start over from 1: another writer was
   faster; nothing was written).
4. New rows go in under keys ``T:<id>`` (and ``T.<p>:<id>`` for a long document's further passages: :func:`doc_rows`)
   with ``added = N``, ``attempt = T``; the keys of the rows it replaces or removes (all of a document's passages),
   what it changed in the lexicon and its head go in state rows of T. Readers of C see none of this.
5. Propose T as write N (:mod:`.consensus`). The decision is the commit point: readers that look after it see all
   of the write. If another attempt was decided, T's rows stay hidden for good (T is a loser) and the write fails
   with "another writer took over; nothing of this write is visible".
6. Mark the replaced and removed rows ``removed = N``, then ``marked:N``; write the head hint. (A reader that comes
   before the marks hides those rows by key.)

A kill anywhere before 5 leaves C's answers; the rerun settles and does the write; a kill after 5 leaves N's
answers, and the rerun finds its digest committed, whatever other writers committed since. A writer paused anywhere,
for any time, cannot make a write half-visible. A write becomes visible only as a whole, and only if its writer
returns success or has not returned yet (a writer that paused after proposing may be carried to the decision by
another, and then learns it succeeded).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from twotower.checks import given, switch
from twotower.retrieval.index import fingerprint
from twotower.retrieval.index.errors import IndexStoreError, UnknownIdError
from twotower.retrieval.index.files import describe
from twotower.retrieval.index.versions import collect_garbage, new_temp_dir, publish
from twotower.retrieval.index.newdocs import NewDocs
from twotower.retrieval.milvus import client as mc
from twotower.retrieval.milvus.filtering import metadata_kinds
from twotower.retrieval.milvus.lexical import SparseBM25
from twotower.retrieval.milvus.consensus import decide
from twotower.retrieval.milvus.lease import EngineLock, TakenOver
from twotower.retrieval.milvus.rows import scan
from twotower.retrieval.milvus.vectors import MilvusVectors
from twotower.retrieval.milvus.state import (
    CHUNK, MAX_DELTAS, State, crash_point, documents_visible, lexicon_chain, new_token, visible,
)

METADATA_KINDS = "metadata_kinds"  # the manifest's key: {dotted path: kinds of value held there}
BATCH = 1_024  # ids per query (an `in [...]` list: far below Milvus' 16,384 results and its expression limits)
ROWS_ENV = "TWOTOWER_MILVUS_BATCH_ROWS"  # rows per insert, at most (default 1,024; the crash tests use fewer)
ROW_BYTES = 16 << 20  # bytes per insert, at most (gRPC messages: 64 MiB by default on a server)
EMPTY_TERM = 4_294_967_294  # a term id no query holds: the sparse vector of a document without terms (Milvus refuses {})


def check_sizes(docs: NewDocs) -> None:
    """Ids, titles and texts within Milvus' VARCHAR limits (bytes of UTF-8), each too long one named."""
    for doc_id, title, text in zip(docs.ids, docs.titles, docs.texts):
        for name, value, limit in (("id", doc_id, mc.MAX_ID_BYTES), ("title", title, mc.MAX_VARCHAR),
                                   ("text", text, mc.MAX_VARCHAR)):
            size = len(value.encode("utf-8"))
            if size > limit:
                raise IndexStoreError(f"document '{doc_id[:80]}': its {name} is {size} bytes of UTF-8; a Milvus index "
                                      f"holds at most {limit} (split the document, or use "
                                      f"{given('backend', 'faiss')})")


def doc_rows(docs: NewDocs, weighed, seq: int, token: int, kind: MilvusVectors) -> list[dict]:
    """The collection's rows of ``docs`` written by attempt ``token`` at write ``seq`` (``weighed``: their BM25
    vectors, :class:`.lexical.Weighed`, or None): one row per passage (a document without passages: one, spanning
    its text). Passage 0's row, keyed ``<token>:<id>``, is the document's: title, text, BM25 vector. Passage ``p``'s
    row, keyed ``<token>.<p>:<id>`` (a key no first row can have: the token is hex), holds its vector, its span
    and the document's metadata (filters select rows), no text, and a BM25 vector no query matches. ``kind``: how
    the vectors are stored (:mod:`.vectors`)."""
    values = kind.row_values(docs.vectors)
    metadata = docs.metadata or [{}] * len(docs.ids)
    offsets = docs.offsets if docs.offsets is not None else np.arange(len(docs.ids) + 1)
    rows = []
    for j, doc_id in enumerate(docs.ids):
        for p, v in enumerate(range(int(offsets[j]), int(offsets[j + 1]))):
            a, b = (int(docs.spans[v, 0]), int(docs.spans[v, 1])) if docs.spans is not None else (0, len(docs.texts[j]))
            row = {"pk": f"{token:x}:{doc_id}" if p == 0 else f"{token:x}.{p}:{doc_id}", "id": doc_id,
                   "passage": p, "span_start": a, "span_end": b, "title": docs.titles[j] if p == 0 else "",
                   "text": docs.texts[j] if p == 0 else "", mc.METADATA: metadata[j] or {}, **values[v],
                   "added": int(seq), "removed": 0, "attempt": int(token), "length": 0, "avgdl": 0.0}
            if weighed is not None:
                row[mc.SPARSE] = (weighed.vectors[j] if p == 0 else None) or {EMPTY_TERM: 1e-30}
                if p == 0:
                    row["length"], row["avgdl"] = int(weighed.lengths[j]), float(weighed.avgdl)
            rows.append(row)
    return rows


def _batches(rows: list[dict]):
    """``rows`` in runs of at most ``TWOTOWER_MILVUS_BATCH_ROWS`` rows and about :data:`ROW_BYTES` bytes."""
    most = int(os.environ.get(ROWS_ENV, "1024"))
    start, size = 0, 0
    for i, r in enumerate(rows):
        n = 64 + np.asarray(r.get(mc.DENSE, ())).nbytes + len(r.get(mc.CODES, "")) + 12 * len(
            r.get(mc.SPARSE) or ()) + sum(len(r[f].encode("utf-8")) for f in ("pk", "id", "title", "text")) + len(
            str(r.get(mc.METADATA) or ""))
        if i > start and (i - start >= most or size + n > ROW_BYTES):
            yield rows[start:i]
            start, size = i, 0
        size += n
    if start < len(rows):
        yield rows[start:]


def put_rows(client, uri: str, collection: str, rows: list[dict], *, show_progress: bool, lock=None,
             building: bool = False) -> None:
    """Insert ``rows`` (new keys: each attempt writes its own) in batches (``batch:<i>`` steps, the lease renewed),
    then, for a build (``building``), :func:`.client.persist` them (a write persists at its end: :func:`mark`)."""
    from tqdm.auto import tqdm

    with mc.milvus_errors(uri, collection, "writing documents"), \
            tqdm(total=len(rows), desc="milvus", unit="doc", disable=not show_progress) as bar:
        for b, batch in enumerate(_batches(rows)):
            client.insert(collection, batch)
            bar.update(len(batch))
            crash_point(f"batch:{b + 1}")
            if lock is not None:
                lock.renew()
        crash_point("before-flush")
        if building:
            mc.persist(client, uri, collection, building=True)
        crash_point("after-flush")


def _fields(lexical: bool, kind: MilvusVectors) -> list[str]:
    return ["pk", "id", "passage", "span_start", "span_end", "title", "text", mc.METADATA, *kind.fields, "added",
            "removed", "attempt", "length", "avgdl"] + ([mc.SPARSE] if lexical else [])


def query_all(client, collection: str, expr: str, fields: list[str]) -> list[dict]:
    """Every row ``expr`` selects, with ``fields`` (:func:`.rows.scan`'s pages)."""
    return list(scan(client, collection, expr, fields))


def settle(client, uri: str, collection: str, state: State, head: dict, lexical: bool) -> None:
    """Step 1 of the module's docstring: finish and tidy what committed writes left. Everything here follows from
    decisions alone (a settler paused anywhere writes what any other would), so it is safe however writers overlap."""
    seq, token = int(head["seq"]), int(head["token"])
    with mc.milvus_errors(uri, collection, "settling earlier writes"):
        if head.get("pending"):  # write C's replaced and removed rows, not yet marked
            mark(client, uri, collection, head["pending"], seq, lexical, MilvusVectors.from_manifest(head["manifest"]))
            state.mark_done(seq)
        # rows removed before the committed write; those it removed stay, as its state rows do: a reader of the
        # write before it reads them (a reader of C reads C whole while write C + 2 is undecided: State.intact)
        client.delete(collection, filter=f"removed > 0 and removed < {seq}")
        if head.get("hidden"):
            client.delete(collection, filter=f"attempt in [{', '.join(str(int(t)) for t in head['hidden'])}]")
    # the state rows of the committed write and of the one before: a reader that opened that one may still load them
    keep = {(seq, token), *(tuple(x) for x in lexicon_chain(head)), *(tuple(x) for x in head.get("prev_keep", []))}
    state.clean(head, keep)
    crash_point("recovered")


def mark(client, uri: str, collection: str, keys: list[str], seq: int, lexical: bool, kind: MilvusVectors) -> None:
    """Mark the rows ``keys`` removed by committed write ``seq``: each row as it is, with ``removed = seq`` (the same
    row whoever writes it; ``kind``: how its vector is stored); the write's last step: its rows are persisted
    (:func:`.client.persist`: a server flushed)."""
    for i in range(0, len(keys), BATCH):
        rows = client.query(collection, filter=mc.ids_filter(keys[i:i + BATCH], "pk"), output_fields=_fields(lexical, kind))
        rows = [dict(r, removed=seq, **{mc.DENSE: kind.stored_value(r[mc.DENSE])}) for r in rows
                if int(r["removed"]) in (0, seq)]
        if rows:
            client.upsert(collection, rows)
        crash_point("marking")
    mc.persist(client, uri, collection)


def digest(op: str, ids, titles=(), texts=(), replace: bool = False, metadata=None) -> str:
    parts = [op, bool(replace), list(ids), list(titles), list(texts)]
    if metadata and any(metadata):  # documents with metadata: it belongs to the write too
        parts.append(list(metadata))
    payload = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def done_before(store, state: State, head: dict, key: str, ids: list[str], adds: bool,
                old: dict | None = None) -> bool:
    """Whether the write of digest ``key`` on ``ids`` (an add or replace with ``adds``, else a remove) is committed
    at ``head`` already: ``head``'s own write, or an earlier one whose effect still stands: every id's visible row
    is the one it wrote (an add), or none of the ids is there (a remove). A write that later writes undid is not
    done (the same add after its documents were removed adds them again). ``old``: the visible rows of ``ids`` at
    ``head`` by id (:func:`read_rows`; read from ``store`` when an earlier attempt with this digest was decided)."""
    if head.get("write") == key:
        return True
    found = state.committed(key, int(head["seq"]))
    if found is None:
        return False
    if old is None:
        old = read_rows(store.client, store.uri, store.collection, ids, head, ["pk", "id", "attempt"])
    if adds:
        return all(d in old and int(old[d]["attempt"]) == found[1] for d in ids)
    return not any(d in old for d in ids)


def _shown(ids: list[str]) -> str:
    return ", ".join(repr(d) for d in ids[:5]) + (" …" if len(ids) > 5 else "")


def write(store, *, docs: NewDocs | None = None, remove: list[str] | None = None, replace: bool = False,
          show_progress: bool = True) -> dict:
    """Add/replace ``docs`` or remove ``remove`` as one write (see the module's docstring); the new head.
    :class:`.lease.TakenOver` when another writer took over (nothing of this write is visible then)."""
    client, uri, coll = store.client, store.uri, store.collection
    state = State(client, uri, coll)
    ids = list(docs.ids) if docs is not None else list(dict.fromkeys(remove or []))
    key = (digest("add", ids, docs.titles, docs.texts, replace, docs.metadata) if docs is not None
           else digest("remove", ids))
    with EngineLock(state) as lock:
        while True:
            head = state.head()
            lexical = bool(head["manifest"].get("bm25"))
            settle(client, uri, coll, state, head, lexical)
            if head.get("write") == key:  # this very write committed before a crash: done (the cheap case)
                return head
            seq, token = int(head["seq"]) + 1, new_token()
            state.register(seq, token)
            crash_point("registered")
            if state.decided(seq) is None:
                break
            lock.renew()  # another attempt became write N meanwhile (nothing of this one written): again
        kind = MilvusVectors.from_manifest(head["manifest"])
        old = read_rows(client, uri, coll, ids, head, _fields(lexical, kind))
        if (old if docs is not None else len(old) < len(ids)) and done_before(
                store, state, head, key, ids, docs is not None, old):  # committed before, other writes since
            return head
        if docs is not None and old and not replace:
            dup = [d for d in ids if d in old]
            raise IndexStoreError(f"{store.root}: {len(dup)} document id(s) are already in the index: {_shown(dup)} "
                                  f"(pass {switch('replace')} to overwrite them)")
        if docs is None and len(old) < len(ids):
            missing = [d for d in ids if d not in old]
            raise UnknownIdError(f"{store.root}: {len(missing)} document id(s) not in the index (Milvus collection "
                                 f"'{coll}'): {_shown(missing)}")
        lexicon = state.load_lexicon(head) if lexical else None
        rows = []
        if lexicon is not None:  # the leaving documents' terms no longer count (df, number of documents, length)
            lexicon.mark()
            lexicon.forget([o[mc.SPARSE] for o in old.values()], [int(o["length"]) for o in old.values()])
        if docs is not None:
            texts = [f"{t} {x}".strip() if t else x for t, x in zip(docs.titles, docs.texts)]
            rows = doc_rows(docs, lexicon.doc_vectors(texts) if lexicon is not None else None, seq, token, kind)
        put_rows(client, uri, coll, rows, show_progress=show_progress, lock=lock)
        blobs, blobs_of, deltas = head["blobs"], head["blobs_of"], list(head.get("deltas", []))
        if lexicon is not None:  # new terms' ids, df, the count and length: the lexicon of write N
            blobs, blobs_of, deltas = save_lexicon(state, seq, token, lexicon, blobs, blobs_of, deltas)
        crash_point("blobs")
        dropped = fingerprint.combine((d, o["title"], o["text"]) for d, o in old.items())
        added = fingerprint.combine(zip(docs.ids, docs.titles, docs.texts)) if docs is not None else 0
        corpus = fingerprint.entry(fingerprint.parse(head["manifest"].get("corpus")) or 0, added, -dropped)
        removed = [k for o in old.values() for k in o["_keys"]]
        n = int(head["manifest"]["num_docs"]) + (len(docs.ids) if docs is not None else 0) - len(old)
        vectors = int(head["manifest"].get("num_vectors", n)) + len(rows) - len(removed)
        manifest = dict(head["manifest"], num_docs=n, num_vectors=vectors, corpus=corpus, version=seq)
        if head["manifest"].get("passages"):
            manifest["num_passages"] = vectors
        if docs is not None:  # the kinds of metadata the documents have held, per path (filtering.py)
            manifest[METADATA_KINDS] = metadata_kinds(docs.metadata or [], head["manifest"].get(METADATA_KINDS))
        # the attempts that lost write C: hidden for good (a paused one may still write rows of C)
        losers = sorted({*map(int, head.get("losers", [])), *(state.registered(int(head["seq"])) - {int(head["token"])})})
        new_head = {"seq": seq, "token": token, "manifest": manifest, "blobs": blobs, "blobs_of": blobs_of,
                    "deltas": deltas, "write": key, "losers": losers,
                    "removed": state.save_removals(seq, token, removed),
                    "prev_keep": [[int(head["seq"]), int(head["token"])], *lexicon_chain(head)]}
        state.save_value(new_head)
        lock.renew()
        crash_point("proposing")
        decision = decide(state, seq, token, {"token": token})
        if int(decision["token"]) != token:
            with mc.milvus_errors(uri, coll, "deleting this write's rows"):  # hidden anyway; tidy
                client.delete(coll, filter=f"attempt == {token}")
            raise TakenOver(f"Milvus collection '{coll}' at {uri}: another writer took over (it became write {seq}); "
                            "nothing of this write is visible: run it again")
        crash_point("committed")
        with mc.milvus_errors(uri, coll, "marking replaced and removed documents"):
            mark(client, uri, coll, removed, seq, lexical, kind)
        state.mark_done(seq)
        crash_point("marked")
        state.hint(seq)
        return dict(new_head, hidden=sorted({*losers, *(state.registered(seq) - {token})}), pending=[])


def read_rows(client, uri: str, collection: str, ids: list[str], head: dict, fields: list[str]) -> dict[str, dict]:
    """The rows of ``ids`` a reader of ``head`` sees (batched queries), by id: each document's own row (passage 0),
    with ``"_keys"``, the keys of all of its rows (its passages')."""
    out: dict[str, dict] = {}
    keys: dict[str, list[str]] = {}
    with mc.milvus_errors(uri, collection, "reading documents"):
        for i in range(0, len(ids), BATCH):
            where = mc.ids_filter(ids[i:i + BATCH])
            found = client.query(collection, filter=f"{where} and ({documents_visible(head)})", output_fields=fields)
            for e in found:
                out[e["id"]] = e
            if not found:  # none of these documents is there: no passages either (one query fewer for an add)
                continue
            # every passage's key (a query without a limit returns all rows: pymilvus' query iterator pages by
            # pasting the last key unescaped into the filter, which an id holding a quote breaks)
            for e in client.query(collection, filter=f"{where} and ({visible(head)})", output_fields=["pk", "id"]):
                keys.setdefault(e["id"], []).append(e["pk"])
    for doc_id, e in out.items():
        e["_keys"] = keys.get(doc_id) or [e["pk"]]
    return out


def save_lexicon(state: State, seq: int, token: int, lexicon: SparseBM25, blobs: dict[str, int], blobs_of: list,
                 deltas: list) -> tuple[dict[str, int], list, list]:
    """Store the lexicon of attempt ``token`` at write ``seq`` (:meth:`SparseBM25.mark` taken at its start) as a
    delta on the chain ``blobs_of`` + ``deltas``, or whole when the chain would hold :data:`.state.MAX_DELTAS` deltas
    or more rows of deltas than the whole lexicon has: ``(blobs, blobs_of, deltas)`` for the head."""
    delta = json.dumps(lexicon.delta(), ensure_ascii=True, separators=(",", ":"))
    rows = max(1, -(-len(delta) // CHUNK))
    if len(deltas) + 1 >= MAX_DELTAS or sum(n for *_, n in deltas) + rows > sum(blobs.values()):
        return state.save_lexicon(seq, token, lexicon), [seq, token], []
    return blobs, blobs_of, [*deltas, [seq, token, state.save_delta(seq, token, delta)]]


def write_version(root: Path, manifest: dict, lexicon: SparseBM25 | None, *, keep: int = 2) -> Path:
    """Publish ``manifest`` (and the lexicon's files) as the next version of the local folder ``root`` — a cache of
    what the collection's head says (call under the writer lock)."""
    tmp = new_temp_dir(root)
    if lexicon is not None:
        lexicon.save(tmp)
    manifest = dict(manifest)
    manifest["files"] = describe(tmp)
    final = publish(root, tmp, manifest)
    collect_garbage(root / "versions", final.name, keep)
    return final
