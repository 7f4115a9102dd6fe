"""Bring an index up to date with a set of documents read from files, in one write: new files added, changed files
(another ``sha256`` of their bytes) re-encoded, and only they, files that are gone removed.

The documents a sync manages are those that carry a ``sha256`` in their metadata (every document read from a file:
:mod:`twotower.data.files`); documents added otherwise (no ``sha256``) are left alone. The plan is made from the
live version. Locally the write is one atomic write — one new version holding the new and changed documents' vectors
and without the changed and removed ones' — so a reader sees the index before the sync or after it, never half of
it. On Milvus it is two committed writes, each whole: the new and changed documents, then the removals (a reader
between them sees the new files and the removed ones both).

Example::

    from twotower.retrieval.sync import plan_sync

    plan = plan_sync(store, documents)
    print(plan.report())   # {"added": 2, "updated": 3, "removed": 2, "unchanged": 57, "skipped": []}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from twotower.errors import TwoTowerError

HASH_KEY = "sha256"


@dataclass
class SyncPlan:
    """What a sync does: the ids ``added``, ``updated`` (content changed) and ``removed`` (managed documents whose
    file is gone), how many are ``unchanged``, the ``documents`` to encode (added and updated, in id order), and the
    files ``skipped`` on reading (``{"path", "reason"}``)."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    documents: list = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.added or self.updated or self.removed)

    def report(self) -> dict:
        """``{"added": n, "updated": n, "removed": n, "unchanged": n, "skipped": [{"path", "reason"}, ...]}``."""
        return {"added": len(self.added), "updated": len(self.updated), "removed": len(self.removed),
                "unchanged": self.unchanged, "skipped": list(self.skipped)}


def managed(store) -> dict[str, str]:
    """``{id: sha256}`` of the documents in ``store`` (one version) that a sync manages."""
    from twotower.retrieval.manage import records, selected_ids

    ids = selected_ids(store, {HASH_KEY: {"$exists": True}})
    return {r["_id"]: (r.get("metadata") or {}).get(HASH_KEY) for r in records(store, ids)}


def plan_sync(store, documents: Sequence, skipped: Sequence[dict] = ()) -> SyncPlan:
    """The :class:`SyncPlan` that brings ``store`` to ``documents`` (each with its ``sha256`` metadata); a file
    skipped on reading (``skipped``) whose document is indexed is kept as it is, not removed."""
    held = managed(store)
    other = set(store.existing([d.id for d in documents])) - set(held)
    if other:
        shown = ", ".join(repr(d) for d in sorted(other)[:5])
        raise TwoTowerError(f"{len(other)} file(s) have the id of a document the index holds that was not read from a "
                            f"file (no {HASH_KEY} in its metadata): {shown}; remove those documents first, or sync "
                            "into another index")
    plan = SyncPlan(skipped=[dict(s) for s in skipped])
    unreadable = {s["path"] for s in plan.skipped}
    seen = set()
    for doc in sorted(documents, key=lambda d: d.id):
        seen.add(doc.id)
        digest = (doc.metadata or {}).get(HASH_KEY)
        if not isinstance(digest, str):
            raise TwoTowerError(f"document {doc.id!r}: no {HASH_KEY} in its metadata; sync takes documents read from "
                                "files (twotower.data.files.load_files)")
        if doc.id not in held:
            plan.added.append(doc.id)
            plan.documents.append(doc)
        elif held[doc.id] != digest:
            plan.updated.append(doc.id)
            plan.documents.append(doc)
        else:
            plan.unchanged += 1
    plan.removed = sorted(d for d in held if d not in seen and d not in unreadable)
    plan.unchanged += sum(1 for d in held if d not in seen and d in unreadable)
    if plan.removed and len(plan.removed) >= len(store) and not plan.documents:
        raise TwoTowerError(f"{store.root}: the sync would remove all {len(store)} documents, and an index keeps at "
                            "least one: check the folder, or build a new index")
    return plan


def apply_sync(store, plan: SyncPlan, *, encoder, cfg, source: str = "sync"):
    """Write ``plan`` to ``store``: the documents to encode encoded by ``encoder`` (a loaded encoder, or the index's
    own model when None) with ``cfg`` (``source`` names them in errors), added with the changed ones replaced and the removed ones left out, in one
    write. Returns the new store (``store`` itself when nothing changes)."""
    if not plan.changes:
        return store
    if not plan.documents:
        return store.remove(plan.removed, show_progress=False)
    from twotower.retrieval.indexing import add_documents_from
    from twotower.retrieval.manage import is_milvus

    if is_milvus(store) and plan.removed:  # Milvus: the new and changed documents, then the removals (two writes)
        store = add_documents_from(store, plan.documents, replace=True, cfg=cfg, encoder=encoder, source=source)
        return store.remove(plan.removed, show_progress=False)
    return add_documents_from(store, plan.documents, replace=True, cfg=cfg, encoder=encoder,
                              source=source, remove=plan.removed)


__all__ = ["HASH_KEY", "SyncPlan", "apply_sync", "managed", "plan_sync"]
