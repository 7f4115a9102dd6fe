"""Writing to a Milvus-backed index so that a crash cannot half-do it, and rerunning it finishes it.

A write (add, replace, remove) runs under the collection's write lease (:class:`.state.EngineLock`) and the index
folder's writer lock, as write number N = the committed ``seq`` C + 1:

1. *Recover*: rows of a write that never committed (``added > C``) are deleted, rows it marked (``removed > C``)
   are un-marked, rows removed by committed writes are deleted for good, stale lexicon rows dropped. Idempotent.
2. If the last committed write has this write's digest, it is done: nothing more (a rerun after a kill that came
   after the commit point).
3. New rows go in with ``added = N`` under keys ``N:<id>`` (so a replaced document's old row stays beside its new
   one), rows replaced or removed are marked ``removed = N``; then flush. Readers of C see none of this.
4. What the write changed in the lexicon (the new terms' ids, the df of the terms it touched, the document count) is
   written as delta rows of write N (every so often the whole lexicon instead: :mod:`.state`), then the head row
   names N: the commit point. Readers that look at the head after it see the whole write.

A kill anywhere before 4 leaves C's answers; the rerun recovers and does the write; a kill after 4 leaves N's
answers, and the rerun finds its digest in the head.
"""

from __future__ import annotations

import hashlib
import json
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
from twotower.retrieval.milvus.state import CHUNK, MAX_DELTAS, EngineLock, State, crash_point, lexicon_chain, visible

METADATA_KINDS = "metadata_kinds"  # the manifest's key: {dotted path: kinds of value held there}
BATCH = 256  # rows per upsert / ids per query
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


def doc_rows(docs: NewDocs, sparse: list | None, seq: int) -> list[dict]:
    """The collection's rows of ``docs`` written by write ``seq``."""
    vectors = np.asarray(docs.vectors, dtype=np.float32)
    metadata = docs.metadata or [{}] * len(docs.ids)
    rows = []
    for j, doc_id in enumerate(docs.ids):
        row = {"pk": f"{seq}:{doc_id}", "id": doc_id, "title": docs.titles[j], "text": docs.texts[j],
               mc.METADATA: metadata[j] or {}, mc.DENSE: vectors[j], "added": int(seq), "removed": 0}
        if sparse is not None:
            row[mc.SPARSE] = sparse[j] or {EMPTY_TERM: 1e-30}
        rows.append(row)
    return rows


def put_rows(client, uri: str, collection: str, rows: list[dict], *, show_progress: bool, lock=None) -> None:
    """Upsert ``rows`` in batches (``batch:<i>`` crash points, the lease renewed), then flush."""
    from tqdm.auto import tqdm

    with mc.milvus_errors(uri, collection, "writing documents"), \
            tqdm(total=len(rows), desc="milvus", unit="doc", disable=not show_progress) as bar:
        for b, i in enumerate(range(0, len(rows), BATCH)):
            client.upsert(collection, rows[i:i + BATCH])
            bar.update(len(rows[i:i + BATCH]))
            crash_point(f"batch:{b + 1}")
            if lock is not None:
                lock.renew()
        crash_point("before-flush")
        client.flush(collection)
        crash_point("after-flush")


def _fields(lexical: bool) -> list[str]:
    return ["pk", "id", "title", "text", mc.METADATA, mc.DENSE, "added", "removed"] + ([mc.SPARSE] if lexical else [])


def query_all(client, collection: str, expr: str, fields: list[str]) -> list[dict]:
    it = client.query_iterator(collection, batch_size=1000, filter=expr, output_fields=fields)
    out: list[dict] = []
    try:
        while batch := it.next():
            out.extend(batch)
    finally:
        it.close()
    return out


def recover(client, uri: str, collection: str, state: State, head: dict, lexical: bool) -> None:
    """Undo what writes after ``head`` left (step 1 of the module's docstring); drop committed removals."""
    seq = int(head["seq"])
    with mc.milvus_errors(uri, collection, "recovering from an unfinished write"):
        client.delete(collection, filter=f"added > {seq}")
        marked = query_all(client, collection, f"removed > {seq}", _fields(lexical))
        for i in range(0, len(marked), BATCH):
            client.upsert(collection, [dict(r, removed=0) for r in marked[i:i + BATCH]])
        client.delete(collection, filter=f"removed > 0 and removed <= {seq}")
        client.flush(collection)
    # the lexicon rows of the committed write and of the one before: a reader that opened that one may still load it
    before = head.get("prev_chain", [head.get("prev_blobs_seq", seq)])
    state.drop_blobs_except({*lexicon_chain(head), *(int(s) for s in before)})


def digest(op: str, ids, titles=(), texts=(), replace: bool = False, metadata=None) -> str:
    parts = [op, bool(replace), list(ids), list(titles), list(texts)]
    if metadata and any(metadata):  # documents with metadata: it belongs to the write too
        parts.append(list(metadata))
    payload = json.dumps(parts, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _shown(ids: list[str]) -> str:
    return ", ".join(repr(d) for d in ids[:5]) + (" …" if len(ids) > 5 else "")


def write(store, *, docs: NewDocs | None = None, remove: list[str] | None = None, replace: bool = False,
          show_progress: bool = True) -> dict:
    """Add/replace ``docs`` or remove ``remove`` as one write (see the module's docstring); the new head."""
    client, uri, coll, root = store.client, store.uri, store.collection, store.root
    state = State(client, uri, coll)
    with EngineLock(state) as lock:
        head = state.head()
        lexical = bool(head["manifest"].get("bm25"))
        recover(client, uri, coll, state, head, lexical)
        crash_point("recovered")
        ids = list(docs.ids) if docs is not None else list(dict.fromkeys(remove or []))
        key = (digest("add", ids, docs.titles, docs.texts, replace, docs.metadata) if docs is not None
               else digest("remove", ids))
        if head.get("write") == key:  # this very write committed before a crash: done
            return head
        seq, new = int(head["seq"]), int(head["seq"]) + 1
        old = {}
        with mc.milvus_errors(uri, coll, "reading documents"):
            for i in range(0, len(ids), BATCH):
                for e in client.query(coll, filter=f"{mc.ids_filter(ids[i:i + BATCH])} and ({visible(seq)})",
                                      output_fields=_fields(lexical)):
                    old[e["id"]] = e
        if docs is not None and old and not replace:
            dup = [d for d in ids if d in old]
            raise IndexStoreError(f"{root}: {len(dup)} document id(s) are already in the index: {_shown(dup)} "
                                  f"(pass {switch('replace')} to overwrite them)")
        if docs is None and len(old) < len(ids):
            missing = [d for d in ids if d not in old]
            raise UnknownIdError(f"{root}: {len(missing)} document id(s) not in the index (Milvus collection "
                                 f"'{coll}'): {_shown(missing)}")
        lexicon = state.load_lexicon(head) if lexical else None
        rows = []
        if lexicon is not None:  # the leaving documents' terms no longer count (df, number of documents)
            lexicon.mark()
            lexicon.forget([o[mc.SPARSE] for o in old.values()])
        if docs is not None:
            texts = [f"{t} {x}".strip() if t else x for t, x in zip(docs.titles, docs.texts)]
            rows = doc_rows(docs, lexicon.doc_vectors(texts) if lexicon is not None else None, new)
        rows += [dict(r, removed=new) for r in old.values()]  # replaced or removed: invisible from write N on
        put_rows(client, uri, coll, rows, show_progress=show_progress, lock=lock)
        blobs, blobs_seq, deltas = head["blobs"], head["blobs_seq"], list(head.get("deltas", []))
        if lexicon is not None:  # new terms' ids, df and the count: the lexicon of write N
            blobs, blobs_seq, deltas = save_lexicon(state, new, lexicon, blobs, blobs_seq, deltas)
        crash_point("blobs")
        dropped = fingerprint.combine((d, o["title"], o["text"]) for d, o in old.items())
        added = fingerprint.combine(zip(docs.ids, docs.titles, docs.texts)) if docs is not None else 0
        corpus = fingerprint.entry(fingerprint.parse(head["manifest"].get("corpus")) or 0, added, -dropped)
        with mc.milvus_errors(uri, coll, "counting documents"):
            n = int(client.query(coll, filter=visible(new), output_fields=["count(*)"])[0]["count(*)"])
        manifest = dict(head["manifest"], num_docs=n, num_vectors=n, corpus=corpus, version=new)
        if docs is not None:  # the kinds of metadata the documents have held, per path (filtering.py)
            manifest[METADATA_KINDS] = metadata_kinds(docs.metadata or [], head["manifest"].get(METADATA_KINDS))
        head = {"seq": new, "manifest": manifest, "blobs": blobs, "blobs_seq": blobs_seq, "deltas": deltas,
                "write": key, "prev_chain": lexicon_chain(head)}
        lock.renew()
        state.commit(head)
        return head


def save_lexicon(state: State, seq: int, lexicon: SparseBM25, blobs: dict[str, int], blobs_seq: int,
                 deltas: list) -> tuple[dict[str, int], int, list]:
    """Store the lexicon of write ``seq`` (:meth:`SparseBM25.mark` taken at its start) as a delta on the chain
    ``blobs_seq`` + ``deltas``, or whole when the chain would hold :data:`.state.MAX_DELTAS` deltas or more rows of
    deltas than the whole lexicon has: ``(blobs, blobs_seq, deltas)`` for the head."""
    delta = json.dumps(lexicon.delta(), ensure_ascii=True, separators=(",", ":"))
    rows = max(1, -(-len(delta) // CHUNK))
    if len(deltas) + 1 >= MAX_DELTAS or sum(n for _, n in deltas) + rows > sum(blobs.values()):
        return state.save_lexicon(seq, lexicon), seq, []
    return blobs, blobs_seq, [*deltas, [seq, state.save_delta(seq, delta)]]


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
